"""Waiting for another process's record lock is bounded and says what it waits for.

The scaler and local backends keep baselines and claims in locked files
(``filestore.FileRecordStore``) and hold the lock across the service calls
of a reconcile or a baseline recording. A process that stops while holding
it (a ``ddlscale`` command suspended with Ctrl-Z, a debugger, a hung
filesystem) must not block every phase on the machine forever.
"""
import subprocess
import sys
import threading
from pathlib import Path
from typing import List

from flytekitplugins_ddlscale import ClusterRef, ScalingError
from flytekitplugins_ddlscale.backends._support.filerecords import FileBookkeeping
from flytekitplugins_ddlscale.backends._support.filestore import FileRecordStore

REF = ClusterRef("ray", "ray-lock")
HOLDER = """
import sys, time
from flytekitplugins_ddlscale.backends._support.filestore import FileRecordStore
from flytekitplugins_ddlscale.refs import ClusterRef

def hold(record):
    print("locked", flush=True)
    time.sleep(600)

FileRecordStore(sys.argv[1]).update(ClusterRef("ray", "ray-lock"), hold)
"""


def test_a_stopped_lock_holder_does_not_block_claims_forever(make_scaler, scaler_server, clean_env: Path):
    scaler_server.add_cluster("ray", REF.name, replicas=1, max_replicas=6)
    records = clean_env / "records"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(records)], stdout=subprocess.PIPE, text=True)
    outcome: List[BaseException] = []
    claimer = None
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        store = FileRecordStore(records, lock_timeout=1.0)
        backend = make_scaler(records=FileBookkeeping(store))

        def claim() -> None:
            try:
                backend.claim(REF, "phase-a", 3)
            except BaseException as exc:  # the outcome under test
                outcome.append(exc)

        claimer = threading.Thread(target=claim, name="blocked-claim")
        claimer.start()
        claimer.join(5)
        assert not claimer.is_alive(), "claim() still blocked on the record lock after 5 s"
        assert outcome and isinstance(outcome[0], ScalingError), outcome
        assert "lock" in str(outcome[0])
    finally:
        holder.kill()
        holder.communicate(timeout=30)
        if claimer is not None:
            claimer.join(30)

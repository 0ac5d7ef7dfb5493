"""A Flyte task under ``@distributed_phase``, run by flytekit's local execution in its own process.

The reliability tests start this script, signal or kill it mid-phase, and
read the scaler test server's request log. The backend comes from the
environment (``DDLSCALE_BACKEND``, ``CLUSTER_SCALER_BASE_URL``, credentials,
``DDLSCALE_STATE_DIR``), as inside a Domino run.

Usage: ``python rel_phase_child.py CLUSTER REPLICAS MARKER [--hold SECONDS] [--task-timeout SECONDS]
[--after PATH]``

With ``--after``, starts the task only once ``PATH`` exists (so two children
can import flytekit in parallel and still enter their phases in order).
Writes ``MARKER`` once the body runs (the cluster is scaled), then holds
until ``MARKER.release`` exists or ``--hold`` seconds pass. Prints
``PHASE-OK`` when the task returned, ``PHASE-ERROR <type>`` when it raised.
"""
import argparse
import datetime
import sys
import time
from pathlib import Path

from flytekit import task, workflow

from flytekitplugins_ddlscale import distributed_phase


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("cluster")
    parser.add_argument("replicas", type=int)
    parser.add_argument("marker", type=Path)
    parser.add_argument("--hold", type=float, default=60.0)
    parser.add_argument("--task-timeout", type=int, default=0)
    parser.add_argument("--after", type=Path, default=None)
    return parser.parse_args()


# Flyte needs tasks at module level, and the decorators' arguments come from the command line.
ARGS = _arguments()
RELEASE = ARGS.marker.with_suffix(".release")


@task(timeout=datetime.timedelta(seconds=ARGS.task_timeout) if ARGS.task_timeout else None)
@distributed_phase(cluster=ARGS.cluster, replicas=ARGS.replicas, timeout=30, framework_ready=False)
def body(hold: float) -> int:
    ARGS.marker.write_text("in body", encoding="utf-8")
    ends = time.monotonic() + hold
    while time.monotonic() < ends and not RELEASE.exists():
        time.sleep(0.02)
    return 0


@workflow
def wf(hold: float) -> int:
    return body(hold=hold)


def main() -> int:
    if ARGS.after is not None:
        ends = time.monotonic() + 120
        while not ARGS.after.exists() and time.monotonic() < ends:
            time.sleep(0.02)
    try:
        wf(hold=ARGS.hold)
    except BaseException as exc:  # report whatever ended the task, including PhaseInterrupted
        print(f"PHASE-ERROR {type(exc).__name__}: {exc}", flush=True)
        return 1
    print("PHASE-OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

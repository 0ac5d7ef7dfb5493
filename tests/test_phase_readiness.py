"""Framework readiness checks: which apply, and the Spark master's JSON status over real HTTP."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from flytekitplugins_ddlscale.errors import ScalingTimeoutError
from flytekitplugins_ddlscale.phase.readiness import wait_framework_ready


class SparkMaster:
    """The part of a Spark standalone master's web UI the check reads: ``GET /json/``."""

    def __init__(self, alive_after: float, workers: int):
        self.started = time.monotonic()
        self.alive_after = alive_after
        self.workers = workers
        master = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/json/":
                    self.send_error(404)
                    return
                alive = master.workers if time.monotonic() - master.started >= master.alive_after else 0
                body = json.dumps({"url": "spark://master:7077", "aliveworkers": alive, "status": "ALIVE",
                                   "workers": [{"state": "ALIVE"}] * alive}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05})

    def __enter__(self):
        self.thread.start()
        return {"SPARK_MASTER_SERVICE_HOST": "127.0.0.1", "SPARK_MASTER_WEBUI_PORT": str(self.httpd.server_address[1])}

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


def test_spark_waits_until_the_master_counts_the_workers():
    with SparkMaster(alive_after=1.2, workers=3) as env:
        assert "3 ALIVE workers" in wait_framework_ready("spark", 3, timeout=20, env=env)


def test_spark_times_out_with_what_it_waited_for():
    with SparkMaster(alive_after=3600, workers=3) as env:
        with pytest.raises(ScalingTimeoutError, match="ALIVE workers on the Spark master"):
            wait_framework_ready("spark", 2, timeout=1.5, env=env)


def test_unreachable_spark_ui_skips_the_check():
    env = {"SPARK_MASTER_SERVICE_HOST": "127.0.0.1", "SPARK_MASTER_WEBUI_PORT": "1"}
    assert wait_framework_ready("spark", 2, timeout=5, env=env) is None


def test_no_check_without_variables_or_workers():
    assert wait_framework_ready("dask", 2, timeout=5, env={}) is None
    assert wait_framework_ready("dask", 0, timeout=5, env={"DASK_SCHEDULER_SERVICE_HOST": "x"}) is None
    assert wait_framework_ready("mpi", 2, timeout=5, env={"DASK_SCHEDULER_SERVICE_HOST": "x"}) is None

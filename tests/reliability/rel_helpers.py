"""Reading the test servers' request logs and state, shared by the reliability tests."""
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, List

MUTATING = ("PATCH", "POST", "PUT", "DELETE")


def mutations(server: Any) -> List[Any]:
    """Requests that could have changed a cluster on the scaler test server."""
    return [r for r in server.requests if r.method in MUTATING and r.path.startswith("/ddl_cluster_scaler/")]


def scale_bodies(server: Any, name: str) -> List[Any]:
    """``replicas`` of every scale PATCH for cluster ``name`` that the server applied (HTTP 200), in order."""
    return [
        r.body.get("replicas")
        for r in server.requests
        if r.method == "PATCH" and "/scale/" in r.path and r.path.endswith("/" + name) and r.status == 200
    ]


def desired(server: Any, kind: str, name: str) -> int:
    """``spec.worker.replicas`` of a cluster on the scaler test server."""
    return int(server.cluster_object(kind, name)["spec"]["worker"]["replicas"])


class Background:
    """A loop (``_run``, until ``_stop`` is set) in a thread named ``name`` from ``with`` entry to exit."""

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name)

    def __enter__(self) -> "Background":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        raise NotImplementedError


class When:
    """Run ``action`` in a thread as soon as ``condition()`` holds (checked every 5 ms, for at most
    ``timeout`` seconds), so faults land at a moment defined by state, not by wall-clock guesses.

    Use as a context manager around the call under test; on exit it stops waiting and joins.
    ``fired`` says whether the action ran.
    """

    def __init__(self, condition: Callable[[], Any], action: Callable[[], Any], timeout: float = 30.0) -> None:
        self._condition = condition
        self._action = action
        self._timeout = timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-when")
        self.fired = False

    def __enter__(self) -> "When":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self._timeout)

    def _run(self) -> None:
        deadline = time.monotonic() + self._timeout
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self._condition():
                self._action()
                self.fired = True
                return
            time.sleep(0.005)


def patched(server: Any, name: str) -> Callable[[], bool]:
    """A condition: the scaler test server has applied a scale PATCH to cluster ``name``."""
    return lambda: bool(scale_bodies(server, name))


def polling(server: Any, name: str) -> Callable[[], bool]:
    """A condition: the client got the answer to its scale PATCH of ``name`` and is polling the cluster."""

    def check() -> bool:
        requests = server.requests
        applied = [i for i, r in enumerate(requests) if r.method == "PATCH" and "/scale/" in r.path
                   and r.path.endswith("/" + name) and r.status == 200]
        return bool(applied) and any(
            r.method == "GET" and "/cluster/" in r.path for r in requests[applied[0] + 1:]
        )

    return check


def select_kubernetes(monkeypatch: Any, kubeconfig: Path, server_url: str, tiers_file: Path) -> Path:
    """Write ``kubeconfig`` for the API server at ``server_url`` (namespace domino-compute) and set the
    environment that selects the Kubernetes backend through it, with the tiers of ``tiers_file``."""
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: test, cluster: {{server: '{server_url}'}}}}]\n"
        "users: [{name: runner, user: {token: kube-token-for-tests}}]\n"
        "contexts: [{name: test, context: {cluster: test, user: runner, namespace: domino-compute}}]\n"
        "current-context: test\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("DDLSCALE_BACKEND", "kubernetes")
    monkeypatch.setenv("DDLSCALE_TIERS_FILE", str(tiers_file))
    return kubeconfig


def child_pids() -> List[int]:
    """Live (non-zombie) child processes of this process, read from /proc."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            found.append(int(entry))
    return found

"""Fixtures of the reliability and security suite.

Everything here is real: the scaler service and Kubernetes test servers on
127.0.0.1, a TCP fault proxy in front of them, backends built as users build
them. Each test gets its own state directory and servers, and must leave no
thread or child process behind (checked after every test).
"""
import contextlib
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest
from rel_helpers import child_pids, select_kubernetes

from flytekitplugins_ddlscale._core.waiting import Backoff
from tests.connector_caches import stop_connector_caches
from tests.servers.k8s_fixtures import k8s, make_backend, tiers_file  # noqa: F401 - fixtures
from tests.servers.scaler_server import DEFAULT_API_KEY, ScalerTestServer

FAST_POLL = Backoff(initial=0.02, factor=1.5, cap=0.1)
"""Poll quickly: the test servers' pods appear within fractions of a second."""
FAST_RETRY = Backoff(initial=0.05, factor=2.0, cap=0.2)
"""Retry quickly (0.05 + 0.1 + 0.2 s for 3 retries); tests about the default budget pass their own."""
PROCESS_WIDE_THREADS = ("loop-runner", "ddlscale-connector-poll_")
"""Names (endings, or beginnings of a pool's numbered threads) of threads a library starts once per process and
keeps: flytekit's event loop runner, and the connector's pool of poll readers (module-wide, so the first test
that polls starts its threads for the rest of the process)."""
OUTER_ENV = ("DOMINO_API_PROXY", "DOMINO_TOKEN", "DOMINO_API_KEY", "DOMINO_RUN_ID", "DDLSCALE_BACKEND",
             "CLUSTER_SCALER_BASE_URL", "DOMINO_STARTING_USER_ID", "KUBECONFIG", "DDLSCALE_TIERS_FILE")
"""Settings of the environment the tests run in that would change which backend or credentials are used."""


def _process_wide(name: str) -> bool:
    return any(name.endswith(part) or name.startswith(part) for part in PROCESS_WIDE_THREADS)


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """Fail a test that leaves threads or child processes running (those it found running are not its own:
    under pytest-xdist a worker may hold the session's control plane or another module's servers)."""
    before = set(threading.enumerate())
    children_before = set(child_pids())
    yield
    stop_connector_caches()  # kept by design for a service's next polls: not the test's leftovers
    deadline = time.monotonic() + 10
    while True:
        extra = [
            t for t in threading.enumerate()
            if t not in before and t.is_alive() and not _process_wide(t.name)
        ]
        kids = [pid for pid in child_pids() if pid not in children_before]
        if not extra and not kids:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not extra, f"threads left running: {[t.name for t in extra]}"
    assert not kids, f"child processes left running: {kids}"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No Domino or backend settings from the outer environment; a fresh state dir (returned)."""
    for name in OUTER_ENV:
        monkeypatch.delenv(name, raising=False)
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("DDLSCALE_STATE_DIR", str(state))
    return state


@pytest.fixture
def scaler_server() -> Iterator[ScalerTestServer]:
    """A started scaler test server with quick head restarts."""
    server = ScalerTestServer()
    server.head_recreate_delay = 0.2
    server.head_ready_delay = 0.2
    with server:
        yield server


@pytest.fixture
def make_scaler(scaler_server: ScalerTestServer, clean_env: Path) -> Iterator[Callable[..., Any]]:
    """Build ``ScalerServiceBackend``s for the test server (closed after the test).

    Defaults: the owner's API key, the test's state dir, a 2 s HTTP timeout,
    fast polling and fast retries; keyword arguments override them.
    """
    import dataclasses

    from flytekitplugins_ddlscale.backends.scaler import ScalerOptions, ScalerServiceBackend

    made: List[Any] = []
    fields = {field.name for field in dataclasses.fields(ScalerOptions)}

    def make(**given: Any) -> Any:
        options: Dict[str, Any] = dict(timeout=2.0, poll_backoff=FAST_POLL, retry_backoff=FAST_RETRY)
        options.update((name, value) for name, value in given.items() if name in fields)
        settings: Dict[str, Any] = dict(base_url=scaler_server.url, api_key=DEFAULT_API_KEY, state_dir=clean_env)
        settings.update((name, value) for name, value in given.items() if name not in fields)
        backend = ScalerServiceBackend(options=ScalerOptions(**options), **settings)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def scaler_env(monkeypatch: pytest.MonkeyPatch, scaler_server: ScalerTestServer, clean_env: Path) -> Dict[str, str]:
    """Environment selecting the scaler backend on the test server, as a Domino run has it."""
    env = {
        "DDLSCALE_BACKEND": "scaler",
        "CLUSTER_SCALER_BASE_URL": scaler_server.url,
        "DOMINO_API_KEY": DEFAULT_API_KEY,
        "DDLSCALE_STATE_DIR": str(clean_env),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture
def k8s_server(k8s: Any) -> Any:
    """The Kubernetes test API server (:func:`tests.servers.k8s_fixtures.k8s`: pods Ready after 20 ms)."""
    return k8s


@pytest.fixture
def make_k8s(k8s_server: Any, tiers_file: Path, clean_env: Path) -> Iterator[Callable[..., Any]]:
    """Build ``KubernetesBackend``s for the test server (closed after the test); options override defaults."""
    with contextlib.ExitStack() as made:
        yield lambda **options: made.enter_context(make_backend(k8s_server, tiers_file, **options))


@pytest.fixture
def k8s_env(monkeypatch: pytest.MonkeyPatch, k8s_server: Any, tiers_file: Path, clean_env: Path, tmp_path: Path) -> Path:
    """Environment selecting the Kubernetes backend on the test server through a kubeconfig (returned)."""
    return select_kubernetes(monkeypatch, tmp_path / "kubeconfig", k8s_server.url, tiers_file)

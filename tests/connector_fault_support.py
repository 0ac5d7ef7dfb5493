"""The connector service under backend faults: a scaler test server behind a name the test can make
stop resolving, the connector service using it, and the faults staged on them.

The scaler service is reached as ``scaler.ddlscale-test``: the connector
process resolves that name through a file (``tests/servers/resolver``), so a
test can fail its DNS without touching the machine's resolver. Faults:

- ``hang``: the service accepts connections and reads requests, answers none;
- ``restart``: the service is killed (every connection cut) and started again
  on its port when the fault ends, its clusters kept;
- ``dns``: the name stops resolving and open connections are cut (a pooled
  connection would outlive a DNS failure), until the fault ends.

:func:`k8s_fault_service` serves the Kubernetes test server behind a TCP
proxy instead, whose fault (:class:`ProxyDown`) is the API server down:
connections refused, open ones cut.
"""
import contextlib
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator, Optional, Tuple

from flytekit import FlyteContextManager
from flytekit.core.type_engine import TypeEngine
from flytekit.tools.translator import get_serializable

from flytekitplugins_ddlscale.tasks import ScaleCluster
from tests.contract_support import write_kubeconfig
from tests.flyte_support import SCALER_ENV
from tests.reliability.rel_proxy import FaultProxy
from tests.servers.k8s_server import K8sTestServer
from tests.servers.scaler_server import DEFAULT_API_KEY, ScalerTestServer
from tests.test_connector_service import SETTINGS, serving

RESOLVER = Path(__file__).resolve().parent / "servers" / "resolver"
HOST = "scaler.ddlscale-test"
FAULTS = ("hang", "restart", "dns")


class Hosts:
    """The file the connector process resolves ``*.ddlscale-test`` names from."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.resolves(True)

    def resolves(self, yes: bool) -> None:
        self.path.write_text(f"{HOST} 127.0.0.1\n" if yes else "")


@contextlib.contextmanager
def fault_service(tmp_path: Path, budget: Optional[float] = None) -> Iterator[Tuple[ScalerTestServer, Any, Hosts]]:
    """A scaler test server, and the connector service (call budget ``budget`` s, its default for None)
    reaching it by name; yields (server, gRPC channel, hosts file)."""
    hosts = Hosts(tmp_path / "hosts")
    with ScalerTestServer() as server:
        env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV and not k.startswith("DDLSCALE_")}
        env.update(
            CLUSTER_SCALER_BASE_URL=f"http://{HOST}:{server.port}", DOMINO_API_KEY=DEFAULT_API_KEY,
            DDLSCALE_STATE_DIR=str(tmp_path / "connector-state"),
            DDLSCALE_CONNECTOR_FRAMEWORK_HOSTS="127.0.0.1", DDLSCALE_FRAMEWORK_READINESS="off",
            DDLSCALE_CONNECTOR_DASHBOARD_URL="http://{host}:{port}",  # the heads are on this machine
            DDLSCALE_TEST_HOSTS=str(hosts.path), PYTHONPATH=str(RESOLVER),
        )
        if budget is not None:
            env["DDLSCALE_CONNECTOR_CALL_BUDGET"] = str(budget)
        with serving(env) as channel:
            yield server, channel, hosts


def start_fault(kind: str, server: ScalerTestServer, hosts: Hosts) -> None:
    """Begin fault ``kind`` (one of :data:`FAULTS`)."""
    if kind == "hang":
        server.hang()
    elif kind == "restart":
        server.stop()
    elif kind == "dns":
        hosts.resolves(False)
        port = server.port
        server.stop()  # cut the pooled connections: new ones need the name
        server.start(port)
    else:
        raise ValueError(f"fault must be one of {FAULTS}, not {kind!r}")


def end_fault(kind: str, server: ScalerTestServer, hosts: Hosts, port: int) -> None:
    """End fault ``kind``: the backend is back."""
    if kind == "hang":
        server.resume()
    elif kind == "restart":
        server.start(port)
    else:
        hosts.resolves(True)


class StagedFault:
    """Fault ``kind`` for ``seconds`` from :meth:`begin`: called by the test before CreateTask, or by the
    driver at the node's first RUNNING answer (:meth:`on_running` is its callback). ``ended`` is set
    once the backend is back."""

    def __init__(self, kind: str, server: ScalerTestServer, hosts: Hosts, seconds: float) -> None:
        self.kind, self.server, self.hosts, self.seconds = kind, server, hosts, seconds
        self.port = server.port
        self.started = threading.Event()
        self.ended = threading.Event()
        self._timer: Any = None

    def on_running(self, _node: Any) -> None:
        self.begin()

    def begin(self) -> None:
        """Start the fault (once), and the timer that ends it."""
        if self.started.is_set():
            return
        self.started.set()
        self._start()
        self._timer = threading.Timer(self.seconds, self._end)
        self._timer.start()

    def _start(self) -> None:
        start_fault(self.kind, self.server, self.hosts)

    def _end(self) -> None:
        end_fault(self.kind, self.server, self.hosts, self.port)
        self.ended.set()

    def close(self) -> None:
        """End the fault now if it is still on (test teardown)."""
        if self._timer is not None:
            self._timer.cancel()
        if self.started.is_set() and not self.ended.is_set():
            self._end()


FAULT_SCALE = ScaleCluster("fault_scale", cluster="ray/fault", replicas=3, timeout=120,
                           framework_url="http://127.0.0.1:8265")
"""The node every fault test runs (each on a cluster of its own)."""


def scale_node(server: ScalerTestServer, name: str, timeout: float, pod_delay: float) -> Tuple[Any, Any]:
    """:data:`FAULT_SCALE`'s template and inputs, scaling a new Ray cluster ``ray/<name>`` from 1 to 3
    workers (ready ``pod_delay`` s after the scale) with a ``timeout`` of its own."""
    server.add_cluster("ray", name, replicas=1, max_replicas=4, min_replicas=None, pod_ready_delay=pod_delay)
    template = get_serializable(OrderedDict(), SETTINGS, FAULT_SCALE).template
    template.custom["cluster"], template.custom["timeout"] = f"ray/{name}", float(timeout)
    ctx = FlyteContextManager.current_context()
    inputs = TypeEngine.dict_to_literal_map(ctx, {}, {})
    return template.to_flyte_idl(), inputs.to_flyte_idl()


class ProxyDown(StagedFault):
    """The API server behind ``proxy`` down (connections refused, open ones cut) for ``seconds``."""

    def __init__(self, proxy: FaultProxy, seconds: float) -> None:
        self.proxy = proxy
        self.kind, self.seconds = "down", seconds
        self.started = threading.Event()
        self.ended = threading.Event()
        self._timer = None

    def _start(self) -> None:
        self.proxy.go_down()

    def _end(self) -> None:
        self.proxy.come_up()
        self.ended.set()


@contextlib.contextmanager
def k8s_fault_service(tmp_path: Path, budget: float) -> Iterator[Tuple[K8sTestServer, Any, FaultProxy]]:
    """The Kubernetes test server behind a fault proxy, and the connector service (call budget ``budget``
    s) reaching it through a kubeconfig; yields (server, gRPC channel, proxy)."""
    with K8sTestServer() as server, FaultProxy.before(server.url) as proxy:
        env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV and not k.startswith("DDLSCALE_")}
        env.update(
            KUBECONFIG=str(write_kubeconfig(tmp_path / "kubeconfig", proxy.url)),
            DDLSCALE_STATE_DIR=str(tmp_path / "connector-state"), DDLSCALE_CONNECTOR_CALL_BUDGET=str(budget),
            DDLSCALE_CONNECTOR_FRAMEWORK_HOSTS="127.0.0.1", DDLSCALE_FRAMEWORK_READINESS="off",
        )
        with serving(env) as channel:
            yield server, channel, proxy


def k8s_scale_node(server: K8sTestServer, name: str, timeout: float) -> Tuple[Any, Any]:
    """:data:`FAULT_SCALE` on the Kubernetes backend: a new Domino Ray cluster ``ray/<name>`` from 1 to 3
    workers, with a ``timeout`` of its own."""
    server.add_cluster("ray", name, replicas=1)
    template = get_serializable(OrderedDict(), SETTINGS, FAULT_SCALE).template
    template.custom["cluster"], template.custom["timeout"] = f"ray/{name}", float(timeout)
    template.custom["backend"] = "kubernetes"
    ctx = FlyteContextManager.current_context()
    return template.to_flyte_idl(), TypeEngine.dict_to_literal_map(ctx, {}, {}).to_flyte_idl()

"""Shared fixtures. Engineers add their own fixtures in their own modules under tests/."""
import sys
from pathlib import Path

import pytest

# Lets tests import the shared test servers as ``tests.servers...`` however pytest is started.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.connector_caches import stop_connector_caches  # noqa: E402
from tests.envtest.fixtures import envtest  # noqa: E402,F401 - the session's real control plane, shared by all modules
from tests.servers.scaler_server import ScalerTestServer  # noqa: E402


RAY_OR_SPARK_LANE = "ray-or-spark"
"""The xdist group of tests marked ``starts_ray`` or ``starts_spark``: one worker runs them one after another,
because a Ray head starting beside another test's Ray head or Spark JVMs on two cores timed out ("node timed
out during startup", "the Ray head ... did not answer within 60s"; also with the Ray and Spark tests in two
lanes side by side). Tests that look for the Ray temp folder a run made rely on it too (no other Ray node
starts meanwhile). Dask clusters and test servers run beside them."""

LANES = {"starts_ray": RAY_OR_SPARK_LANE, "starts_spark": RAY_OR_SPARK_LANE}
"""Marker -> the xdist group of the tests carrying it (separate markers, so that the lanes can be split where
Ray heads start reliably beside Spark JVMs)."""


SHARED_SCOPES = ("module", "package", "class")
"""Fixture scopes that outlive one test: the tests using such a fixture must share the worker it lives in."""


def _shares_a_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture that lives longer than one test (a module's cluster or server)."""
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(definition.scope in SHARED_SCOPES for defs in definitions.values() for definition in defs)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    """Under ``-n N --dist loadgroup`` (the README's test command): the tests of a module that uses a
    module-scoped fixture share one worker, so its clusters and servers start once; every other test
    runs wherever a worker is free (a long module no longer sets the suite's length); tests of the real
    control plane share one worker, so it starts once per suite, not once per worker (a module that stops or
    restarts a control plane of its own, marked ``own_control_plane``, is a group of its own beside them, so
    its minute-long outages no longer lengthen that worker's queue); tests that start
    Ray nodes or Spark JVMs (marked ``starts_ray``, ``starts_spark``) share one worker so that no two of them
    start at once (:data:`RAY_OR_SPARK_LANE`)."""
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        lanes = [lane for marker, lane in LANES.items() if item.get_closest_marker(marker)]
        if item.get_closest_marker("own_control_plane"):
            group = module
        elif item.get_closest_marker("envtest"):
            group = "envtest"
        elif lanes:
            group = lanes[0]
        elif _shares_a_fixture(item):
            group = module
        else:
            group = item.nodeid
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True, scope="session")
def no_deck_listing_at_exit():
    """A test process is no user's flow run: its Decks are not listed after pytest's closing line."""
    yield
    deck = sys.modules.get("flytekitplugins_ddlscale._core.deck")
    if deck is not None:
        import atexit

        atexit.unregister(deck.print_local_decks)


@pytest.fixture(autouse=True)
def fresh_leftovers():
    """Each test is a flow run of its own: the Ctrl-C report forgets clusters earlier tests touched."""
    yield
    leftovers = sys.modules.get("flytekitplugins_ddlscale._services.nodes.interrupted")
    if leftovers is not None:
        leftovers.forget_all()


@pytest.fixture(autouse=True)
def fresh_connector_backends():
    """Each test's connector polls start without backends or shared caches an earlier test's polls kept."""
    yield
    stop_connector_caches()


@pytest.fixture
def scaler_server():
    """A running scaler-service test server (see tests/servers/scaler_server.py); stopped afterwards."""
    with ScalerTestServer() as server:
        yield server


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    """A private ``$DDLSCALE_STATE_DIR`` so records never touch the home directory."""
    path = tmp_path / "state"
    monkeypatch.setenv("DDLSCALE_STATE_DIR", str(path))
    return path


@pytest.fixture
def scaler_backend(scaler_server, tmp_path):
    """A ScalerServiceBackend on ``scaler_server`` as the default owner, with fast polls and retries.

    ``env={}`` keeps it independent of the outer environment (no Nucleus tier catalog).
    """
    from flytekitplugins_ddlscale.backends.scaler import ScalerOptions, ScalerServiceBackend
    from flytekitplugins_ddlscale._core.waiting import Backoff
    from tests.servers.scaler_server import DEFAULT_API_KEY

    backend = ScalerServiceBackend(
        scaler_server.url,
        api_key=DEFAULT_API_KEY,
        state_dir=tmp_path / "scaler-state",
        env={},
        options=ScalerOptions(
            timeout=5.0,
            retry_backoff=Backoff(initial=0.01, factor=2.0, cap=0.05),
            poll_backoff=Backoff(initial=0.02, factor=1.5, cap=0.1),
        ),
    )
    yield backend
    backend.close()

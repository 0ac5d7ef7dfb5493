"""Fixtures of the envtest tier: ``side``, each contract test once per API server.

The session's real control plane (``envtest``) is registered in
``tests/conftest.py``, so it is started once however many modules use it.
"""
from typing import Iterator

import pytest

from tests.envtest.sides import RealServerSide, Side, TestServerSide
from tests.servers.k8s_fixtures import tiers_file  # noqa: F401 - fixture


@pytest.fixture(params=["test-server", pytest.param("api-server", marks=pytest.mark.envtest)])
def side(request: pytest.FixtureRequest, tiers_file) -> Iterator[Side]:  # noqa: F811
    """The repository's test server, then the real kube-apiserver (tests marked ``envtest``)."""
    if request.param == "test-server":
        made: Side = TestServerSide(tiers_file)
    else:
        made = RealServerSide(tiers_file, request.getfixturevalue("envtest"))
    try:
        yield made
    finally:
        made.close()

"""get_backend: precedence of argument, environment and defaults; lazy imports."""
import subprocess
import sys

import pytest

from flytekitplugins_ddlscale import InvalidInputError
from flytekitplugins_ddlscale.backends import backend_name_from_env, get_backend, load_backend_class


@pytest.mark.parametrize(
    "env,expected",
    [
        ({"DDLSCALE_BACKEND": "Kubernetes", "CLUSTER_SCALER_BASE_URL": "http://x"}, "kubernetes"),
        ({"CLUSTER_SCALER_BASE_URL": "http://x"}, "scaler"),
        ({"DOMINO_RUN_ID": "r1"}, "scaler"),
        ({}, "local"),
    ],
)
def test_environment_precedence(env, expected):
    assert backend_name_from_env(env) == expected


def test_argument_wins_and_aliases_resolve(scaler_server, tmp_path, monkeypatch):
    monkeypatch.setenv("DDLSCALE_BACKEND", "local")
    backend = get_backend("service", base_url=scaler_server.url, api_key="k-1234", state_dir=tmp_path)
    try:
        assert backend.name == "scaler" and backend.base_url == scaler_server.url
    finally:
        backend.close()
    monkeypatch.setenv("DDLSCALE_BACKEND", "scaler-service")
    monkeypatch.setenv("CLUSTER_SCALER_BASE_URL", scaler_server.url)
    with get_backend(api_key="k-1234", state_dir=tmp_path) as chosen:
        assert chosen.name == "scaler"


def test_unknown_backend_names_the_choices():
    with pytest.raises(InvalidInputError) as info:
        load_backend_class("nope")
    assert info.value.field == "backend" and "scaler" in info.value.allowed


def test_importing_the_plugin_loads_no_backend_library():
    code = (
        "import sys, flytekitplugins_ddlscale, flytekitplugins_ddlscale.backends;"
        "heavy = [m for m in ('httpx', 'kubernetes', 'dask', 'distributed', 'ray') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_the_base_class_is_the_one_declaration_of_the_public_methods():
    """ClusterBackend declares, documents and does the public methods once; every backend inherits
    them unchanged (BaseBackend is the same class under its earlier name)."""
    import inspect

    from flytekitplugins_ddlscale.backends import BaseBackend, ClusterBackend
    from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
    from flytekitplugins_ddlscale.backends.local import LocalBackend
    from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend

    assert BaseBackend is ClusterBackend
    methods = [name for name, member in vars(ClusterBackend).items()
               if callable(member) and not name.startswith("_")]
    assert {"scale", "reconcile", "claim", "close", "connection_env"} <= set(methods)
    for name in methods:
        assert inspect.getdoc(getattr(ClusterBackend, name)), name
    for backend in (KubernetesBackend, LocalBackend, ScalerServiceBackend):
        assert issubclass(backend, ClusterBackend)
        for name in methods:
            assert inspect.signature(getattr(backend, name)) == inspect.signature(getattr(ClusterBackend, name)), name
    for backend in (BaseBackend, KubernetesBackend, LocalBackend, ScalerServiceBackend):
        assert ClusterBackend in backend.__mro__
        for name in methods:
            assert inspect.signature(getattr(backend, name)) == inspect.signature(getattr(ClusterBackend, name)), name


def test_a_backend_that_leaves_out_a_required_hook_cannot_be_made_and_the_error_names_it():
    """The hooks every backend must write are abstract (as flytekit's connector base does it), so a
    missing one fails when the class is instantiated, naming it, not when a user first reaches it."""
    from flytekitplugins_ddlscale.backends import ClusterBackend
    from flytekitplugins_ddlscale.backends._filebacked import FileRecordsBackend

    class NoHooks(ClusterBackend):
        name = "no-hooks"

    required = {"_observe", "_observe_for_wait", "_wait_workers", "_reach", "_scale_change", "_restore_change",
                "_reconcile_change", "_restart_head", "_record_baseline", "_get_baseline", "_claim", "_renew",
                "_release", "_claims", "_recorded_claims"}
    assert ClusterBackend.__abstractmethods__ == required
    with pytest.raises(TypeError, match="abstract") as caught:
        NoHooks()
    assert all(name in str(caught.value) for name in required)

    # A backend on file records writes only how to observe and apply a size; the records hooks are done.
    assert FileRecordsBackend.__abstractmethods__ == {
        "_observe", "_observe_for_wait", "_wait_workers", "_reach", "_restart_head",
        "_observe_before_change", "_apply_size", "_apply_baseline",
    }


def test_kinds_backends_and_the_cli_s_choices_come_from_their_registries():
    """Adding a backend or a kind touches its registry only: the lists of served kinds, the kinds with worker
    groups and the CLI's and settings' backend names are read from there."""
    from click.testing import CliRunner

    from flytekitplugins_ddlscale.backends import BUILTIN_BACKENDS, available_backends
    from flytekitplugins_ddlscale.backends._support.crds import LAYOUTS
    from flytekitplugins_ddlscale.backends.kubernetes import KubernetesBackend
    from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend
    from flytekitplugins_ddlscale.cli import main
    from flytekitplugins_ddlscale._core import settings
    from flytekitplugins_ddlscale.refs import GROUPED_KINDS, KINDS, KindInfo

    assert KubernetesBackend.capabilities.kinds == set(LAYOUTS) <= set(KINDS)
    assert ScalerServiceBackend.capabilities.kinds == {k for k, info in KINDS.items() if info.served_by_scaler}
    # A kind says whether it has worker groups; being off Domino does not make it so.
    assert GROUPED_KINDS == ("kuberay", "dask-operator")
    assert KindInfo("toy", "toyclusters", "dask", domino=False, autoscaling=False, served_by_scaler=False).worker_groups is False
    for command in (["scale", "--help"], ["run", "--help"]):
        shown = " ".join(CliRunner().invoke(main, command).output.split())
        assert all(name in shown for name in available_backends()), shown
        assert "Worker group (kuberay and dask-operator clusters" in shown
    assert all(name in settings.BACKEND.allowed for name in BUILTIN_BACKENDS)


def test_the_backend_page_names_every_required_hook():
    """docs/backends.md walks through writing a backend: every hook a backend must write is on it."""
    from pathlib import Path

    from flytekitplugins_ddlscale.backends import ClusterBackend
    from flytekitplugins_ddlscale.backends._filebacked import FileRecordsBackend

    page = (Path(__file__).resolve().parent.parent / "docs" / "backends.md").read_text(encoding="utf-8")
    required = ClusterBackend.__abstractmethods__ | FileRecordsBackend.__abstractmethods__
    assert sorted(hook for hook in required if f"`{hook}" not in page) == []

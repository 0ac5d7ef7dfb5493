"""Local backend: tiers, bad input, kinds, selection and bookkeeping -- nothing here starts a cluster.

Each bad-input test also checks that nothing was created: no cluster in the
state directory and (through the fixture) no process running from it.
"""
import os
import subprocess
import sys

import pytest

from flytekitplugins_ddlscale import (
    CapacityExceededError,
    ClusterNotFoundError,
    ClusterRef,
    InvalidInputError,
    ReplicaSpec,
    UnknownTierError,
    UnsupportedOperationError,
)
from flytekitplugins_ddlscale.backends import ClusterBackend, get_backend
from flytekitplugins_ddlscale.backends.local import LOCAL_TIERS_ENV, LocalBackend, dask_env, environ_set
from flytekitplugins_ddlscale.backends.local._tiers import WorkerShape, load_catalog, memory_bytes
from tests.test_local_support import backend, local_state, tiers_file  # noqa: F401

REF = ClusterRef("dask", "inputs")


def test_default_tiers_map_cores_to_threads_and_memory_to_limit():
    catalog = load_catalog()
    shapes = {t.name: WorkerShape.from_tier(t) for t in catalog.tiers()}
    assert [t.name for t in catalog.tiers()] == ["Small", "Medium", "Large"]
    assert (shapes["Small"].nthreads, shapes["Small"].memory_limit) == (1, 2**30)
    assert (shapes["Medium"].nthreads, shapes["Medium"].memory_limit) == (2, 2 * 2**30)
    assert (shapes["Large"].nthreads, shapes["Large"].memory_limit) == (4, 4 * 2**30)


def test_user_tiers_file_from_env_replaces_defaults(tiers_file, monkeypatch, local_state):
    monkeypatch.setenv(LOCAL_TIERS_ENV, str(tiers_file))
    backend = LocalBackend(state_dir=local_state)
    duo = WorkerShape.from_tier(backend.catalog.resolve("Duo", "dask"))
    assert (duo.nthreads, duo.memory_limit) == (2, 768 * 2**20)
    with pytest.raises(UnknownTierError, match="allowed for dask: Duo, Tiny"):
        backend.scale(REF, 1, "Small")
    with pytest.raises(UnknownTierError, match="restricted to ray"):
        backend.scale(REF, 1, "RayOnly")
    assert backend.list_clusters() == []


@pytest.mark.parametrize(
    "text, expected",
    [("1Gi", 2**30), ("512Mi", 512 * 2**20), ("2G", 2 * 10**9), ("1073741824", 2**30), ("1.5Gi", 3 * 2**29)],
)
def test_memory_quantities(text, expected):
    assert memory_bytes(text) == expected


def test_bad_tiers_file_is_refused_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tiers:\n  - name: Odd\n    cores: 1\n    memory: lots\n")
    with pytest.raises(InvalidInputError, match="tiers\\[Odd\\].memory"):
        LocalBackend(state_dir=tmp_path / "s", tiers_file=bad)
    with pytest.raises(InvalidInputError, match="tiers_file"):
        LocalBackend(state_dir=tmp_path / "s", tiers_file=tmp_path / "missing.yaml")


@pytest.mark.parametrize("replicas", [-1, 1001, True, 2.5, "3", None])
def test_bad_replicas_refused_before_anything_starts(backend, replicas):
    with pytest.raises(InvalidInputError, match="replicas"):
        backend.scale(REF, replicas)
    assert backend.list_clusters() == []


def test_bad_timeout_and_tier_refused_before_anything_starts(backend):
    with pytest.raises(InvalidInputError, match="timeout"):
        backend.scale(REF, 1, timeout=0)
    with pytest.raises(UnknownTierError, match="unknown worker_hw_tier='Huge'; allowed for dask: Large, Medium, Small"):
        backend.scale(REF, 1, "Huge")
    with pytest.raises(InvalidInputError, match="worker_hw_tier"):
        backend.scale(REF, 1, "  ")
    with pytest.raises(UnknownTierError, match="head_hw_tier"):
        backend.restart_head(REF, head_hw_tier="Huge")
    with pytest.raises(UnknownTierError):
        backend.claim(REF, "phase-a", 2, "Huge")
    with pytest.raises(InvalidInputError, match="claim_id"):
        backend.claim(REF, "", 2)
    assert backend.list_clusters() == []
    assert backend.get_baseline(REF) is None


def test_strict_above_max_workers_is_refused(local_state):
    backend = LocalBackend(state_dir=local_state, max_workers=2)
    with pytest.raises(CapacityExceededError, match="at most 2"):
        backend.scale(REF, 3, strict=True)
    assert backend.list_clusters() == []


@pytest.mark.parametrize("kind", ["mpi"])
def test_other_kinds_are_unsupported_with_an_explanation(backend, kind):
    ref = ClusterRef(kind, "other")
    for call in (
        lambda: backend.scale(ref, 1),
        lambda: backend.get_state(ref),
        lambda: backend.restart_head(ref),
        lambda: backend.claim(ref, "p", 1),
        lambda: backend.connection_env(ref),
    ):
        with pytest.raises(UnsupportedOperationError, match=f"the local backend runs .*clusters, not {kind} "):
            call()
    assert backend.list_clusters() == []


@pytest.mark.parametrize("platform, kind", [("linux", None), ("linux", "ray"), ("darwin", "dask"), ("darwin", "spark")])
def test_the_platforms_the_local_backend_runs_on_are_accepted(platform, kind):
    from flytekitplugins_ddlscale.backends.local._driver import check_platform

    assert check_platform(platform, kind) is None


@pytest.mark.parametrize("platform, kind, says", [
    ("win32", None, "does not run on win32"),
    ("freebsd14", "dask", "does not run on freebsd14"),
    ("darwin", "ray", "does not run ray clusters on darwin"),
])
def test_another_platform_is_refused_in_one_line_saying_what_runs_where(platform, kind, says):
    from flytekitplugins_ddlscale.backends.local._driver import check_platform

    with pytest.raises(UnsupportedOperationError) as caught:
        check_platform(platform, kind)
    assert str(caught.value) == (
        f"[unsupported] the local backend {says} (it runs linux: dask, ray, spark; darwin: dask, spark)"
    )


def test_missing_cluster_is_reported_not_created(backend):
    with pytest.raises(ClusterNotFoundError, match="ddlscale local up --kind dask --name inputs"):
        backend.get_state(REF)
    with pytest.raises(ClusterNotFoundError):
        backend.connection_env(REF)
    with pytest.raises(ClusterNotFoundError):
        backend.restart_head(REF)
    assert backend.down(REF) is False
    assert backend.list_clusters() == []


def test_restore_without_baseline_or_cluster_is_not_found_and_changes_nothing(backend):
    with pytest.raises(ClusterNotFoundError, match="no local cluster dask/inputs"):
        backend.restore_baseline(REF)
    assert backend.list_clusters() == []


def test_claims_keep_the_largest_and_record_a_baseline(backend):
    assert backend.claim(REF, "phase-a", 2).replicas == 2
    assert backend.claim(REF, "phase-b", 3, "Medium").claim_id == "phase-b"
    baseline = backend.get_baseline(REF)
    assert baseline is not None and baseline.replicas == 0
    assert backend.release(REF, "phase-b").claim_id == "phase-a"
    assert backend.release(REF, "phase-a") is None
    # A second process sees the same records through the state directory.
    other = LocalBackend(state_dir=backend.store.root)
    assert other.get_baseline(REF) == baseline
    assert backend.list_clusters() == []


def test_capabilities_and_protocol(backend):
    assert isinstance(backend, ClusterBackend)
    caps = backend.capabilities
    assert caps.kinds == frozenset({"dask", "ray", "spark"})
    assert caps.observes_readiness and caps.holds_size and caps.persistent_baseline


def test_get_backend_defaults_to_local(monkeypatch, tmp_path):
    for name in ("DDLSCALE_BACKEND", "CLUSTER_SCALER_BASE_URL", "DOMINO_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DDLSCALE_STATE_DIR", str(tmp_path / "state"))
    chosen = get_backend()
    assert isinstance(chosen, LocalBackend)
    assert chosen.store.root == tmp_path / "state" / "local"


def test_environ_set_restores_previous_values(monkeypatch):
    monkeypatch.setenv("DASK_SCHEDULER_SERVICE_HOST", "elsewhere")
    monkeypatch.delenv("DASK_SCHEDULER_SERVICE_PORT", raising=False)
    with environ_set(dask_env("127.0.0.1", 8786)):
        assert os.environ["DASK_SCHEDULER_SERVICE_HOST"] == "127.0.0.1"
        assert os.environ["DASK_SCHEDULER_SERVICE_PORT"] == "8786"
    assert os.environ["DASK_SCHEDULER_SERVICE_HOST"] == "elsewhere"
    assert "DASK_SCHEDULER_SERVICE_PORT" not in os.environ


def test_environ_set_also_sets_the_configuration_of_a_dask_imported_before_for_the_block():
    import dask.config
    import distributed  # noqa: F401 - its defaults join Dask's configuration when it is imported

    values = {
        "DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME": "tls", "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": "/c/tls/ca.pem",
        "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True", "DASK_SCHEDULER_ADDRESS": "tls://127.0.0.1:1",
    }
    connect = dask.config.get("distributed.comm.timeouts.connect")
    with environ_set(values):
        assert dask.config.get("distributed.comm.default-scheme") == "tls"
        assert dask.config.get("distributed.comm.tls.ca-file") == "/c/tls/ca.pem"
        assert dask.config.get("distributed.comm.require-encryption") is True
        assert dask.config.get("scheduler-address") == "tls://127.0.0.1:1"
        # One setting at a time: the rest of the tree it sits in is kept.
        assert dask.config.get("distributed.comm.timeouts.connect") == connect
    assert dask.config.get("distributed.comm.default-scheme") == "tcp"
    assert dask.config.get("distributed.comm.tls.ca-file") is None
    assert dask.config.get("scheduler-address", None) is None


DASK_IMPORTED_IN_THE_BLOCK = """
from flytekitplugins_ddlscale._core.lifetime import environ_set
with environ_set({"DASK_DISTRIBUTED__COMM__DEFAULT_SCHEME": "tls", "DASK_SCHEDULER_ADDRESS": "tls://127.0.0.1:1"}):
    import dask.config
    import distributed
    inside = (dask.config.get("distributed.comm.default-scheme"), dask.config.get("scheduler-address"))
print(inside, (dask.config.get("distributed.comm.default-scheme"), dask.config.get("scheduler-address", None)))
"""


def test_a_dask_first_imported_inside_the_block_keeps_none_of_its_settings_after_it():
    """Dask reads the block's variables as its own when first imported inside it (a ``Client`` made there uses
    them); after the block its configuration is Dask's defaults again, as if the block never was."""
    out = subprocess.run([sys.executable, "-c", DASK_IMPORTED_IN_THE_BLOCK], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "('tls', 'tls://127.0.0.1:1') ('tcp', None)", out.stdout + out.stderr


def test_importing_the_backend_does_not_import_dask():
    code = (
        "import sys, flytekitplugins_ddlscale.backends.local, flytekitplugins_ddlscale.cli.local_commands;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_restore_to_explicit_target_validates_tier_first(backend):
    with pytest.raises(UnknownTierError):
        backend.restore_baseline(REF, ReplicaSpec(1, "Huge"))
    assert backend.list_clusters() == []


SPARK = ClusterRef("spark", "needs-java")


def _refused_before_anything(backend, match):
    for call in (
        lambda: backend.scale(SPARK, 1),
        lambda: backend.claim(SPARK, "p", 1),
        lambda: backend.up(SPARK, 1),
        lambda: backend.get_state(SPARK),
    ):
        with pytest.raises(UnsupportedOperationError, match=match):
            call()
    assert backend.list_clusters() == []
    assert backend.records.get_baseline(SPARK) is None and backend.records.claims(SPARK) == {}


def test_spark_without_java_is_refused_saying_what_to_install(backend, monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    _refused_before_anything(backend, r"need Java, and there is no \$JAVA_HOME/bin/java .*openjdk-17-jre-headless")
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    _refused_before_anything(backend, r"need Java, and there is no java on PATH: install Java 17 or newer")


def test_spark_on_java_11_is_refused_saying_what_to_install(backend, monkeypatch, tmp_path):
    java = tmp_path / "jdk11" / "bin" / "java"
    java.parent.mkdir(parents=True)
    # What `java -version` of an OpenJDK 11 prints (on stderr).
    java.write_text('#!/bin/sh\necho \'openjdk version "11.0.22" 2024-01-16\' >&2\n')
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(java.parent.parent))
    _refused_before_anything(backend, r"need Java 17\+, but \$JAVA_HOME/bin/java .* is Java 11: install .*openjdk-17")


def test_spark_without_pyspark_is_refused_saying_what_to_install(backend, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspark", None)  # how the import system marks a module as absent
    _refused_before_anything(backend, r'need pyspark, which is not installed here: install the package with its "spark" extra and the '
                                       r'constraints \(in a clone: uv pip install -c constraints.txt -e "\.\[spark\]"')


@pytest.mark.parametrize("text, major", [
    ('openjdk version "17.0.15" 2025-04-15', 17),
    ('java version "1.8.0_392"', 8),
    ('openjdk version "21" 2023-09-19', 21),
    ("no version here", None),
])
def test_java_major_versions(text, major):
    from flytekitplugins_ddlscale.backends.local._spark_ops import java_major

    assert java_major(text) == major


def test_java_is_asked_for_its_version_once_per_binary(tmp_path, monkeypatch):
    from flytekitplugins_ddlscale.backends.local._spark_ops import java_command

    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    asked = tmp_path / "asked"
    java.write_text(f'#!/bin/sh\necho x >> {asked}\necho \'openjdk version "17.0.15" 2025-04-15\' >&2\n')
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(java.parent.parent))
    assert java_command() == java_command() == str(java)
    assert asked.read_text() == "x\n"
    # A replaced binary (another modification time) is asked again.
    os.utime(java, ns=(0, 1_000_000_000))
    assert java_command() == str(java) and asked.read_text() == "x\nx\n"

"""How the envtest tier finds what it needs, and says why it cannot run (no control plane started here)."""
import lzma
import os

from tests.envtest import controlplane, crds
from tests.envtest.controlplane import BINARIES, ENV_DIR, missing_requirements, unpacked_binaries


def _packed(folder, text):
    folder.mkdir(parents=True, exist_ok=True)
    for name in BINARIES:
        (folder / f"{name}.xz").write_bytes(lzma.compress(f"#!/bin/sh\necho {name} {text}\n".encode()))
    return folder


def test_without_the_variable_the_reason_names_it(monkeypatch):
    monkeypatch.delenv(ENV_DIR, raising=False)
    reasons = missing_requirements()
    assert any(reason.startswith("$DDLSCALE_ENVTEST_DIR is not set") for reason in reasons)


def test_a_folder_without_the_binaries_is_named_with_what_it_lacks(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_DIR, str(tmp_path))
    (tmp_path / "kube-apiserver.xz").write_bytes(b"")
    reasons = missing_requirements()
    assert f"${ENV_DIR}={tmp_path} lacks kube-controller-manager.xz" in reasons


def test_without_etcd_the_reason_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_DIR, str(_packed(tmp_path / "bin", "v1")))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    reasons = missing_requirements()
    if os.access("/usr/bin/etcd", os.X_OK):
        assert reasons == []
    else:
        assert reasons == ["etcd is not installed (apt-get install etcd-server)"]


def test_binaries_are_unpacked_once_into_a_folder_named_after_their_contents(tmp_path):
    cache = tmp_path / "cache"
    first = unpacked_binaries(_packed(tmp_path / "v1", "v1"), cache)
    assert sorted(first) == sorted(BINARIES)
    assert first["kube-apiserver"].read_text() == "#!/bin/sh\necho kube-apiserver v1\n"
    assert all(os.access(path, os.X_OK) for path in first.values())
    stamp = first["kube-apiserver"].stat().st_mtime_ns
    again = unpacked_binaries(tmp_path / "v1", cache)
    assert again == first and again["kube-apiserver"].stat().st_mtime_ns == stamp
    newer = unpacked_binaries(_packed(tmp_path / "v2", "v2"), cache)
    assert newer["kube-apiserver"].parent != first["kube-apiserver"].parent
    assert newer["kube-apiserver"].read_text().endswith("v2\n")
    assert not list(cache.glob("*/.*.part"))


def test_the_crds_come_from_the_repository_facts_and_keep_free_form_objects():
    found = {d["metadata"]["name"]: d for d in crds.definitions()}
    assert sorted(found) == sorted([
        "rayclusters.distributed-compute.dominodatalab.com", "sparkclusters.distributed-compute.dominodatalab.com",
        "daskclusters.distributed-compute.dominodatalab.com", "mpiclusters.distributed-compute.dominodatalab.com",
        "rayclusters.ray.io", "daskclusters.kubernetes.dask.org", "daskworkergroups.kubernetes.dask.org",
        "daskautoscalers.kubernetes.dask.org",
    ])
    ray = found["rayclusters.distributed-compute.dominodatalab.com"]["spec"]["versions"][0]
    assert ray["subresources"]["scale"]["specReplicasPath"] == ".spec.worker.replicas"
    mpi = found["mpiclusters.distributed-compute.dominodatalab.com"]["spec"]["versions"][0]
    assert "scale" not in mpi["subresources"]
    template = found["rayclusters.ray.io"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    head = template["properties"]["spec"]["properties"]["headGroupSpec"]["properties"]["template"]
    assert head == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert template["properties"]["metadata"] == {"type": "object"}
    assert controlplane.USER == "system:serviceaccount:domino-compute:flyte-runner"

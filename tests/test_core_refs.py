"""ClusterRef and the KINDS table."""
import pytest

from flytekitplugins_ddlscale import KINDS, ClusterRef, InvalidInputError
from flytekitplugins_ddlscale.refs import check_cluster, normalize_kind, parse_cluster, validate_name


@pytest.mark.parametrize("kind,short", [("ray", "ray"), ("RayClusters", "ray"), (" spark ", "spark"), ("mpiclusters", "mpi")])
def test_kinds_normalize(kind, short):
    assert normalize_kind(kind) == short


@pytest.mark.parametrize("kind", ["flink", "", None, 3])
def test_unknown_kind_names_field_and_allowed_values(kind):
    with pytest.raises(InvalidInputError) as info:
        ClusterRef(kind, "x")
    # Each kind is listed once, by its short name; its aliases (rayclusters, ...) are accepted, not listed.
    assert info.value.field == "kind"
    assert info.value.allowed.split(", ") == list(KINDS)


@pytest.mark.parametrize("name", ["", "Upper", "-lead", "trail-", "a_b", "x" * 64, None])
def test_bad_names(name):
    with pytest.raises(InvalidInputError) as info:
        validate_name(name)
    assert info.value.field == "name"


def test_bad_namespace_names_its_field():
    with pytest.raises(InvalidInputError) as info:
        ClusterRef("ray", "ok", "Bad NS")
    assert info.value.field == "namespace"


def test_pod_names_follow_the_operator():
    from flytekitplugins_ddlscale.backends._support.crds import LAYOUTS

    assert set(LAYOUTS) == set(KINDS)
    assert LAYOUTS["ray"].head_pod_name("c") == "c-ray-head-0"
    assert LAYOUTS["spark"].head_pod_name("c") == "c-spark-master-0"
    assert LAYOUTS["dask"].head_pod_name("c") == "c-dask-scheduler-0"
    assert LAYOUTS["mpi"].head_pod_name("c") is None
    assert [LAYOUTS[k].worker_pod_prefix("c") for k in ("ray", "spark", "dask", "mpi")] == [
        "c-ray-worker-", "c-spark-worker-", "c-dask-worker-", "c-mpi-worker-",
    ]
    assert [k for k, info in KINDS.items() if info.served_by_scaler] == ["ray", "spark", "dask"]


def test_for_run_and_parse(monkeypatch):
    assert ClusterRef.for_run("rayclusters", "65F1ab").name == "ray-65f1ab"
    monkeypatch.setenv("DOMINO_RUN_ID", "run9")
    assert ClusterRef.for_run("dask") == ClusterRef("dask", "dask-run9")
    monkeypatch.delenv("DOMINO_RUN_ID")
    with pytest.raises(InvalidInputError) as info:
        ClusterRef.for_run("dask")
    assert info.value.field == "run_id"
    assert ClusterRef.parse("ns1/spark/s1") == ClusterRef("spark", "s1", "ns1")
    assert str(ClusterRef.parse("ray/r1")) == "ray/r1"
    with pytest.raises(InvalidInputError):
        ClusterRef.parse("just-a-name")
    assert ClusterRef("ray", "r").plural == "rayclusters"


@pytest.mark.parametrize(
    "text, reason",
    [
        ("dask-x", "use kind/name, e.g. 'dask/x'"),
        ("rayclusters-r1", "use kind/name, e.g. 'ray/r1'"),
        ("my-cluster", "not a kind (ray, spark, dask, mpi, kuberay, dask-operator) and no '/'; use kind/name, e.g. 'dask/my-cluster'"),
        ("dask//x", "the name is empty; use kind/name, e.g. 'dask/x'"),
        ("dask/", "the name is empty"),
        ("/x", "the kind is empty"),
        ("ns//x", "the kind is empty"),
        ("/dask/x", "the namespace is empty"),
        ("a/b/c/d", "3 '/' (at most 2)"),
        ("  ", "empty"),
        (7, "not a string"),
    ],
)
def test_cluster_strings_say_what_is_wrong(text, reason):
    for check in (parse_cluster, check_cluster):
        with pytest.raises(InvalidInputError) as info:
            check(text)
        assert info.value.field == "cluster" and info.value.reason.startswith(reason)
        assert reason in str(info.value) and "'<kind>/<name>'" in str(info.value)


def test_cluster_strings_that_name_a_cluster(monkeypatch):
    monkeypatch.delenv("DOMINO_RUN_ID", raising=False)
    assert parse_cluster(" dask/x ") == ClusterRef("dask", "x")
    assert parse_cluster("ns1/sparkclusters/etl") == ClusterRef("spark", "etl", "ns1")
    assert check_cluster(" ray ") == "ray"  # a bare kind is resolved later, at run time
    with pytest.raises(InvalidInputError) as info:
        check_cluster("flink/x")
    assert info.value.field == "kind"


def test_bare_kind_outside_a_domino_run_says_to_give_kind_and_name(monkeypatch):
    monkeypatch.delenv("DOMINO_RUN_ID", raising=False)
    with pytest.raises(InvalidInputError) as info:
        parse_cluster("dask")
    assert info.value.field == "cluster"
    assert "give kind/name (e.g. 'dask/my-cluster') outside a Domino run" in info.value.reason
    monkeypatch.setenv("DOMINO_RUN_ID", "Run7")
    assert parse_cluster("dask") == ClusterRef("dask", "dask-run7")


def test_parse_refuses_a_bare_kind_and_keeps_the_given_namespace():
    with pytest.raises(InvalidInputError) as info:
        ClusterRef.parse("dask")
    assert "'<namespace>/<kind>/<name>'" in info.value.allowed and "bare kind" not in info.value.allowed
    assert ClusterRef.parse("dask/x", namespace="ns2") == ClusterRef("dask", "x", "ns2")


def test_operator_kinds_take_a_worker_group_and_round_trip():
    from flytekitplugins_ddlscale.refs import cluster_text

    ref = parse_cluster("ml/kuberay/my-ray@gpu-group")
    assert (ref.namespace, ref.kind, ref.name, ref.group) == ("ml", "kuberay", "my-ray", "gpu-group")
    assert str(ref) == "ml/kuberay/my-ray@gpu-group" and parse_cluster(str(ref)) == ref
    assert cluster_text(ClusterRef("dask-operator", "d", group="highmem")) == "dask-operator/d@highmem"
    assert check_cluster(" dask-operator/d ") == "dask-operator/d"
    assert parse_cluster("rayclusters/x").kind == "ray"  # plurals keep naming Domino's kinds
    assert KINDS["kuberay"].framework == "ray" and KINDS["dask-operator"].framework == "dask"


@pytest.mark.parametrize(
    "text, field, words",
    [
        ("ray/x@workers", "group", "ray clusters have one worker section"),
        ("kuberay/x@bad group", "group", "a worker group name"),
        ("kuberay", "cluster", "kuberay clusters need a name"),
    ],
)
def test_worker_groups_are_checked_before_anything_runs(text, field, words):
    with pytest.raises(InvalidInputError, match=words) as caught:
        parse_cluster(text)
    assert caught.value.field == field


def test_a_domino_run_cluster_is_of_a_domino_kind():
    with pytest.raises(InvalidInputError, match="Domino's kinds") as caught:
        ClusterRef.for_run("kuberay", "run-1")
    assert caught.value.field == "kind"


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: ClusterRef("dask", "abc\n"), "name"),
        (lambda: ClusterRef("dask", "abc", namespace="team\n"), "namespace"),
        (lambda: ClusterRef("kuberay", "abc", group="gpu\n"), "group"),
        (lambda: ClusterRef.for_run("dask", "abc", namespace="ns\n"), "namespace"),
    ],
)
def test_a_trailing_newline_is_refused_in_names_namespaces_and_groups(make, field):
    # "$" matches before a final newline: such names broke the scaler URL (httpx.InvalidURL),
    # made folders and worker names with a newline and broke `ddlscale local list`.
    with pytest.raises(InvalidInputError) as caught:
        make()
    assert caught.value.field == field and caught.value.value.endswith("\n")


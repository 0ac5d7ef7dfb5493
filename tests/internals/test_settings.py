"""One place for settings: ``_core/settings.py`` owns every variable the package reads or sets.

The checks read the package's own source (no module outside the settings
module reads ``os.environ`` or spells a variable's name), compare
``docs/settings.md`` with the module, and try precedence and validation on the
settings and through the functions that use them.
"""
import ast
import re
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

import flytekitplugins_ddlscale
from flytekitplugins_ddlscale._core import settings
from flytekitplugins_ddlscale._core.progress import quiet
from flytekitplugins_ddlscale.backends import backend_name_from_env
from flytekitplugins_ddlscale.backends._support.filestore import default_state_dir
from flytekitplugins_ddlscale.backends.local import _dask_watch as dask_watch
from flytekitplugins_ddlscale.backends.scaler._client import resolve_base_url
from flytekitplugins_ddlscale.backends.scaler._polls import max_rps_from
from flytekitplugins_ddlscale.errors import InvalidInputError
from flytekitplugins_ddlscale._framework.endpoints import enabled_by_env, resolve_endpoint

ROOT = Path(flytekitplugins_ddlscale.__file__).parent
DOCS = ROOT.parent / "docs" / "settings.md"
SETTINGS_MODULE = "_core/settings.py"

READS_ALLOWED = {
    # Sets variables for a block and puts back what was there: it writes the environment and reads
    # back only the names it was given to set.
    "_core/lifetime.py": "writes the variables it is given and restores them (environ_set)",
    # A key for backends kept open: a digest of the whole environment, no one variable.
    "_services/opening.py": "digests the whole environment",
    # Loaded by path into a Dask scheduler process: it imports only the standard library.
    "backends/local/_dask_watch.py": "standalone: runs inside a Dask scheduler, imports no plugin module",
}
"""Modules that may touch ``os.environ``, and why."""

REGENERATE = (
    "regenerate the table: python -c \"from flytekitplugins_ddlscale._core.settings import markdown_table; "
    "print(markdown_table(), end='')\""
)

SPELLING_ALLOWED = ("backends/local/_dask_watch.py",)
"""The standalone scripts spell the names they read; :func:`test_the_standalone_scripts_read_the_settings_names`
checks those are the settings module's."""


def package_modules() -> Iterator[Tuple[str, ast.AST]]:
    for path in sorted(ROOT.rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def environment_reads(tree: ast.AST) -> List[int]:
    """Lines that touch ``os.environ``/``os.environb``/``os.getenv`` or import them from ``os``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb", "getenv"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in ("environ", "environb", "getenv") for alias in node.names):
                lines.append(node.lineno)
    return sorted(lines)


def spelled_names(tree: ast.AST) -> List[Tuple[int, str]]:
    """String constants that are a setting's name, or look like one of the plugin's own variables."""
    names = {s.name for s in settings.SETTINGS}
    own = re.compile(rf"{settings.PREFIX}[A-Z0-9_]+")
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and (node.value in names or own.fullmatch(node.value))
    ]


def test_no_module_outside_the_settings_module_reads_the_environment():
    found = [
        f"{module}:{line}"
        for module, tree in package_modules()
        if module != SETTINGS_MODULE and module not in READS_ALLOWED
        for line in environment_reads(tree)
    ]
    assert found == [], "read variables through flytekitplugins_ddlscale._core.settings"


def test_no_module_outside_the_settings_module_spells_a_variable_name():
    found = [
        f"{module}:{line} {name}"
        for module, tree in package_modules()
        if module != SETTINGS_MODULE and module not in SPELLING_ALLOWED
        for line, name in spelled_names(tree)
    ]
    assert found == [], "use the names of flytekitplugins_ddlscale._core.settings"


def test_the_scans_find_every_form_of_a_read_and_a_spelled_name():
    source = (
        "import os\nfrom os import getenv\n"
        "a = os.environ.get('X')\nb = os.getenv('Y')\nc = os.environ['DOMINO_RUN_ID']\n"
        "env = os.environ if e is None else e\nd = env.get('DDLSCALE_NEW_THING')\n"
    )
    tree = ast.parse(source)
    assert environment_reads(tree) == [2, 3, 4, 5, 6]
    assert spelled_names(tree) == [(5, "DOMINO_RUN_ID"), (7, "DDLSCALE_NEW_THING")]


def test_the_allow_lists_name_modules_that_exist_and_need_it():
    modules = dict(package_modules())
    for module in READS_ALLOWED:
        assert environment_reads(modules[module]), f"{module} no longer reads the environment: drop it"
    for module in SPELLING_ALLOWED:
        assert spelled_names(modules[module]), f"{module} no longer spells a name: drop it"


def test_the_standalone_scripts_read_the_settings_names():
    names = {s.name for s in settings.SETTINGS}
    for module in SPELLING_ALLOWED:
        tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
        spelled = {value for _, value in spelled_names(tree)}
        assert spelled <= names, f"{module} reads variables the settings module does not define"
    assert dask_watch.MARK_ENV == settings.LOCAL_CLUSTER.name
    assert dask_watch.watch_grace() == settings.WATCH_GRACE.default or settings.WATCH_GRACE.is_set()


def test_every_setting_has_one_name_a_group_and_a_meaning():
    names = [s.name for s in settings.SETTINGS]
    assert len(names) == len(set(names))
    for s in settings.SETTINGS:
        assert s.group in settings.GROUPS and s.meaning and s.allowed and s.kind
        assert (s.group == settings.OURS) == s.name.startswith(settings.PREFIX), s.name


def table_rows(text: str) -> Dict[str, List[str]]:
    """The rows of the settings table in ``text``, by variable name."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
    return rows


def test_the_docs_table_lists_every_setting_with_its_default():
    documented = table_rows(DOCS.read_text(encoding="utf-8"))
    defined = table_rows(settings.markdown_table())
    assert sorted(set(defined) - set(documented)) == [], "settings missing from docs/settings.md"
    assert sorted(set(documented) - set(defined)) == [], "docs/settings.md lists variables the module does not define"
    differing = {name: (documented[name], defined[name]) for name in defined if documented[name] != defined[name]}
    assert differing == {}, REGENERATE
    assert settings.markdown_table() in DOCS.read_text(encoding="utf-8"), REGENERATE


def test_the_table_check_finds_a_missing_an_extra_and_a_changed_default():
    table = settings.markdown_table()
    rows = table_rows(table)
    assert set(rows) == {s.name for s in settings.SETTINGS}
    assert rows["DDLSCALE_SCALER_MAX_RPS"][3] == "100.0"
    edited = table.replace("| 100.0 |", "| 50 |").replace("`DDLSCALE_QUIET`", "`DDLSCALE_QUIETER`")
    changed = table_rows(edited)
    assert "DDLSCALE_QUIET" not in changed and "DDLSCALE_QUIETER" in changed
    assert changed["DDLSCALE_SCALER_MAX_RPS"][3] == "50"


# Precedence: argument > environment > default.

def test_an_argument_wins_over_the_environment_and_the_environment_over_the_default():
    env = {"DDLSCALE_SCALER_MAX_RPS": "7.5"}
    assert settings.SCALER_MAX_RPS.value(3, env) == 3.0
    assert settings.SCALER_MAX_RPS.value(None, env) == 7.5
    assert settings.SCALER_MAX_RPS.value(None, {}) == 100.0
    assert max_rps_from(3, env) == 3.0 and max_rps_from(None, env) == 7.5 and max_rps_from(None, {}) == 100.0
    url = "http://scaler.example:8080"
    assert resolve_base_url("http://given/", {"CLUSTER_SCALER_BASE_URL": url}) == "http://given"
    assert resolve_base_url(None, {"CLUSTER_SCALER_BASE_URL": url + "/"}) == url
    assert resolve_base_url(None, {}) == settings.CLUSTER_SCALER_BASE_URL.default


def test_an_empty_variable_counts_as_unset():
    assert settings.SCALER_MAX_RPS.value(None, {"DDLSCALE_SCALER_MAX_RPS": ""}) == 100.0
    assert resolve_endpoint("dask", env={"DASK_SCHEDULER_SERVICE_HOST": "h", "DDLSCALE_DASK_DASHBOARD_PORT": " "}).url \
        == "http://h:8787"
    assert backend_name_from_env({"DDLSCALE_BACKEND": "", "DOMINO_RUN_ID": ""}) == "local"


def test_the_backend_choice_follows_its_precedence():
    assert backend_name_from_env({"DDLSCALE_BACKEND": " K8s ", "DOMINO_RUN_ID": "r"}) == "k8s"
    assert backend_name_from_env({"DOMINO_RUN_ID": "r"}) == "scaler"
    assert backend_name_from_env({"CLUSTER_SCALER_BASE_URL": "http://s"}) == "scaler"
    assert backend_name_from_env({}) == "local"


def test_settings_are_read_when_used_not_at_import(monkeypatch, tmp_path):
    monkeypatch.setenv("DDLSCALE_STATE_DIR", str(tmp_path / "one"))
    assert default_state_dir() == tmp_path / "one"
    monkeypatch.setenv("DDLSCALE_STATE_DIR", str(tmp_path / "two"))
    assert default_state_dir() == tmp_path / "two"
    monkeypatch.delenv("DDLSCALE_STATE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_state_dir() == tmp_path / ".ddlscale"
    monkeypatch.setenv("DDLSCALE_QUIET", "yes")
    assert quiet()
    monkeypatch.setenv("DDLSCALE_QUIET", "0")
    assert not quiet()


# Validation: a bad value names the variable and the values it takes.

BAD_VALUES = [
    ("DDLSCALE_SCALER_MAX_RPS", "fast"),
    ("DDLSCALE_SCALER_MAX_RPS", "0"),
    ("DDLSCALE_FRAMEWORK_READINESS", "maybe"),
    ("DDLSCALE_DASK_DASHBOARD_PORT", "http"),
    ("DDLSCALE_RAY_DASHBOARD_PORT", "70000"),
    ("DDLSCALE_SPARK_WEBUI_PORT", "-1"),
    ("SPARK_MASTER_WEBUI_PORT", "x"),
    ("DASK_SCHEDULER_SERVICE_PORT", "port"),
    ("DDLSCALE_FRAMEWORK_URL", "ftp://head:21"),
    ("DDLSCALE_RAY_URL", "not a url"),
    ("DDLSCALE_WATCH_GRACE", "soon"),
    ("DDLSCALE_NO_WAIT_LIMIT", "0"),
]


@pytest.mark.parametrize("name,value", BAD_VALUES)
def test_a_bad_value_names_the_variable_and_the_values_it_takes(name, value):
    setting = next(s for s in settings.SETTINGS if s.name == name)
    with pytest.raises(InvalidInputError) as caught:
        setting.value(env={name: value})
    assert caught.value.field == name and caught.value.allowed == setting.allowed
    assert name in str(caught.value) and setting.allowed in str(caught.value)


def test_a_bad_argument_is_named_as_the_argument():
    with pytest.raises(InvalidInputError, match="max_requests_per_second") as caught:
        max_rps_from(-2, {"DDLSCALE_SCALER_MAX_RPS": "5"})
    assert caught.value.allowed == settings.SCALER_MAX_RPS.allowed


def test_the_callers_raise_the_settings_errors():
    with pytest.raises(InvalidInputError, match="DDLSCALE_FRAMEWORK_READINESS") as caught:
        enabled_by_env({"DDLSCALE_FRAMEWORK_READINESS": "maybe"})
    assert "on/off" in caught.value.allowed
    with pytest.raises(InvalidInputError, match="DDLSCALE_DASK_URL") as caught:
        resolve_endpoint("dask", env={"DDLSCALE_DASK_URL": "http://user:secret@head:8787"})
    assert "secret" not in str(caught.value)


def test_a_bad_setting_is_refused_before_anything_is_sent(scaler_server, tmp_path):
    from flytekitplugins_ddlscale import ClusterRef
    from flytekitplugins_ddlscale.backends.scaler import ScalerServiceBackend
    from tests.servers.scaler_server import DEFAULT_API_KEY

    scaler_server.add_cluster("dask", "held", replicas=1, max_replicas=4)
    scaler_server.clear_requests()
    with pytest.raises(InvalidInputError) as caught:
        with ScalerServiceBackend(scaler_server.url, api_key=DEFAULT_API_KEY, state_dir=tmp_path / "state",
                                  env={"DDLSCALE_SCALER_MAX_RPS": "fast"}) as backend:
            backend.scale(ClusterRef("dask", "held"), 3)
    assert caught.value.field == "DDLSCALE_SCALER_MAX_RPS" and caught.value.allowed == settings.SCALER_MAX_RPS.allowed
    assert scaler_server.requests == [] and not (tmp_path / "state").exists()


NUMERIC = [s for s in settings.SETTINGS if s.kind in ("number", "port")]


@pytest.mark.parametrize("value", ["abc", "-5", "0", "nan", "inf", "1e400", "٣", " "])
@pytest.mark.parametrize("setting", NUMERIC, ids=lambda s: s.name)
def test_every_numeric_setting_refuses_what_is_not_a_positive_finite_number_in_range(setting, value):
    """One rule for every number and port: text, zero, negatives, NaN, infinity and non-ASCII digits are
    refused naming the variable and the values it takes (blank means unset: the default)."""
    if not value.strip():
        assert setting.value(env={setting.name: value}) == setting.default
        return
    with pytest.raises(InvalidInputError) as caught:
        setting.value(env={setting.name: value})
    assert caught.value.field == setting.name and caught.value.allowed == setting.allowed

"""The README agrees with what runs: its code is the examples' code, CI runs its install and test
commands as written, and the Python versions it names are the ones the package and constraints.txt
declare."""
import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
SETUP = (ROOT / "setup.py").read_text(encoding="utf-8")


def _blocks(language: str) -> list:
    """The README's fenced blocks of ``language``, without their fences."""
    return re.findall(rf"^```{language}\n(.*?)^```$", README, flags=re.M | re.S)


def _block_under(heading: str) -> str:
    """The one bash block of the README section titled ``heading``."""
    section = README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```bash\n(.*?)^```$", section, flags=re.M | re.S)
    return block


def _supported() -> list:
    """The minor versions setup.py's classifiers name, as "3.N"."""
    return re.findall(r'"Programming Language :: Python :: (3\.\d+)"', SETUP)


def _python_requires() -> SpecifierSet:
    return SpecifierSet(re.search(r'python_requires="([^"]+)"', SETUP).group(1))


def test_every_python_snippet_of_the_readme_is_code_of_an_example_the_tests_run():
    examples = {path.name: path.read_text(encoding="utf-8") for path in (ROOT / "examples").glob("*.py")}
    snippets = _blocks("python")
    assert snippets
    strays = [snippet for snippet in snippets if not any(snippet in text for text in examples.values())]
    assert strays == [], "README snippets that are not verbatim in examples/*.py"


def test_ci_runs_the_readme_install_and_test_commands_as_written():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for heading in ("Install", "Test"):
        command = _block_under(heading).strip()
        assert "\n" not in command, f"the README's {heading} block is one command"
        # As a line of its own, or with `|| status=$?` so the script goes on to its checks after a failure.
        assert any(line == command or line.startswith(command + " || ") for line in ci.splitlines()), \
            f"the README's {heading} command is not a line of .ci/run"
    # The smoke runs on other Pythons install with the same command too.
    install = _block_under("Install").strip()
    installs = [line for line in ci.splitlines() if "uv pip install" in line]
    assert len(installs) >= 3 and all(install in line for line in installs)


def test_the_install_makes_its_own_venv_so_a_distribution_python_accepts_it():
    command = _block_under("Install")
    first = command.split("&&")[0].strip()
    assert first == "python3 -m venv .venv"
    assert "python3 -m pip" not in command, "the distribution's Python refuses pip outside a venv"
    assert " -q " not in command.split("&&")[-1], "the long step must show progress"


def test_python_requires_classifiers_and_the_readme_name_the_same_versions():
    supported = _supported()
    requires = _python_requires()
    assert [f"3.{minor}" for minor in range(6, 16) if f"3.{minor}" in requires] == supported
    named = re.search(r"^Python (3\.\d+), (3\.\d+) or (3\.\d+) ", README, flags=re.M)
    assert named and list(named.groups()) == supported
    # The build's own refusal (uv ignores python_requires' upper bound) names the same range.
    lowest, highest = re.search(r"SUPPORTED = \(\((3), (\d+)\), \((3), (\d+)\)\)", SETUP).group(2, 4)
    assert [f"3.{lowest}", f"3.{highest}"] == [supported[0], supported[-1]]
    assert f"supports Python 3.{lowest} to 3.{highest} " in SETUP


def test_constraints_pin_exactly_one_version_of_each_package_for_every_supported_python():
    requirements = [Requirement(line) for line in (ROOT / "constraints.txt").read_text().splitlines()
                    if line.strip() and not line.startswith("#")]
    assert [str(r) for r in requirements if len(r.specifier) != 1 or next(iter(r.specifier)).operator != "=="] == []
    for version in _supported():
        env = {"python_version": version, "python_full_version": f"{version}.0", "sys_platform": "linux",
               "platform_system": "Linux", "platform_machine": "x86_64", "platform_python_implementation": "CPython",
               "implementation_name": "cpython", "os_name": "posix"}
        chosen = [r.name for r in requirements if r.marker is None or r.marker.evaluate(env)]
        assert sorted(name for name in set(chosen) if chosen.count(name) > 1) == [], version
        assert {"flytekit", "flyte", "dask", "ray", "pyspark"} <= set(chosen), version


def test_the_readme_names_no_path_of_a_particular_machine():
    assert re.findall(r"(?:/work|/root|/home|/Users)/\S+", README) == []

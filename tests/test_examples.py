"""The examples: the README quick start runs end to end with `pyflyte run`; the Domino ones serialize."""
import fcntl
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections import OrderedDict
from pathlib import Path

import pytest
from flytekit.configuration import Image, ImageConfig, SerializationSettings
from flytekit.tools.translator import get_serializable

from tests.flyte_support import SCALER_ENV, processes_mentioning

ROOT = Path(__file__).resolve().parent.parent
PYFLYTE = Path(sys.executable).with_name("pyflyte")
SETTINGS = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="img", tag="1")))


def quick_start_env(state: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in SCALER_ENV}
    env.update(DDLSCALE_STATE_DIR=str(state), DDLSCALE_EXAMPLE_PREPARE_SECONDS="1")
    return env


QUICK_START = [str(PYFLYTE), "run", "examples/hybrid_flow.py", "hybrid_flow", "--n", "5000"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def take_down(state: Path) -> None:
    subprocess.run([str(PYFLYTE.with_name("ddlscale")), "local", "down", "--all"],
                   env=quick_start_env(state), capture_output=True, timeout=120)


def _shape(line: str) -> str:
    """A line with its numbers left out: what every run of the same flow prints alike."""
    return re.sub(r"\d+", "#", line)


def _readme_quick_start_summaries() -> list:
    """The summary lines of the README's quick-start output."""
    readme = (ROOT / "README.md").read_text()
    sample = readme.split("```text\nRunning Execution on local.\n", 1)[1].split("```\n", 1)[0]
    return [line for line in sample.splitlines() if ": dask/hybrid-demo " in line]


@pytest.mark.slow
def test_quick_start_runs_end_to_end_prints_one_summary_per_step_and_leaves_nothing_running(tmp_path):
    state = tmp_path / "state"
    done = subprocess.run(QUICK_START, cwd=ROOT, env=quick_start_env(state), capture_output=True, text=True,
                          timeout=300)
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert done.stdout.strip().splitlines()[-1] == "True"
        summaries = [line for line in done.stderr.splitlines() if ": dask/hybrid-demo " in line]
        assert [line.split(":")[0] for line in summaries] == [
            "request_workers", "workers_ready", "scale_down", "check_in_phase"
        ], done.stderr
        assert summaries[0] == "request_workers: dask/hybrid-demo 0 -> 2 workers requested, not waited for"
        assert re.fullmatch(
            r"workers_ready: dask/hybrid-demo 2 workers ready after \d+\.\d s"
            r" \(framework: 2 workers registered with the Dask scheduler.*\)", summaries[1])
        assert re.fullmatch(r"scale_down: dask/hybrid-demo 2 -> 0 workers in \d+\.\d s(?: \(\d+\.\d s waiting\))?", summaries[2])
        assert re.match(r"check_in_phase: dask/hybrid-demo 0 -> 2 workers ready in \d+\.\d s", summaries[3])
        assert summaries[3].endswith("restored to 0 workers (as found)")
        assert "Decks of this run (open in a browser):" in done.stderr and "No module named pip" not in done.stderr
        assert re.search(r"Distributed phase: check_in_phase: file://\S+/deck\.html", done.stderr)
        _each_deck_opens_on_its_own_node(done.stderr)
        assert [_shape(line) for line in summaries] == [_shape(line) for line in _readme_quick_start_summaries()]
        assert processes_mentioning(str(state)) == []
        assert not list((state / "local" / "clusters").glob("*/cluster.json"))
    finally:
        take_down(state)


DECK_TAB = re.compile(r'<li onclick="handleLinkClick\(this\)">([^<]*)</li>')
DECK_TITLE = re.compile(r"<h2>([^<]*)</h2>")


def _each_deck_opens_on_its_own_node(stderr: str) -> None:
    """Each node's Deck file holds its own Deck only, as its first tab (the tab the file opens on),
    with no blank fact and the workers its plot shows listed by tier."""
    listed = re.findall(r"^  (.+): file://(\S+/deck\.html)$", stderr, re.MULTILINE)
    ours = {"Cluster scaling", "Cluster wait", "Distributed phase"}
    assert [title.split(":")[0] for title, _ in listed] == [
        "Cluster scaling", "Cluster wait", "task Deck", "Cluster scaling", "Distributed phase"
    ], stderr
    for title, path in listed:
        page = Path(path).read_text()
        tabs, titles = DECK_TAB.findall(page), DECK_TITLE.findall(page)
        if title == "task Deck":
            assert not ours & set(tabs), tabs
            continue
        assert tabs[0] == title.split(":")[0] and not ours & set(tabs[1:]), (title, tabs)
        assert titles == [title], (title, titles)
        assert "<td></td>" not in page, title  # no blank fact
        if not title.endswith("request_workers"):  # the one node that does not wait: its workers may come later
            assert "no workers were up" not in page, title  # each node had workers up, as its plot shows


def _gone(state: Path, timeout: float = 30.0) -> bool:
    """Whether every process mentioning ``state`` has exited (pyspark's gateway JVM exits moments
    after the Python process that started it)."""
    deadline = time.monotonic() + timeout
    while processes_mentioning(str(state)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return processes_mentioning(str(state)) == []


@pytest.mark.slow
@pytest.mark.starts_spark
@pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                    reason="Java is absent: local Spark clusters need Java 17+ (apt-get install openjdk-17-jre-headless)")
def test_spark_example_runs_locally_end_to_end_on_a_real_spark_cluster(tmp_path):
    state = tmp_path / "state"
    done = subprocess.run([str(PYFLYTE), "run", "examples/spark_local.py", "spark_flow", "--lines", "200"],
                          cwd=ROOT, env=quick_start_env(state), capture_output=True, text=True, timeout=600)
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert done.stdout.strip().splitlines()[-1] == "True"
        summaries = [line for line in done.stderr.splitlines() if ": spark/spark-demo " in line]
        assert [line.split(":")[0] for line in summaries] == [
            "request_workers", "workers_ready", "check_in_phase", "restore"
        ]
        assert "\r" not in done.stderr and "[Stage " not in done.stderr, "Spark's progress bar shows"
        assert re.fullmatch(
            r"workers_ready: spark/spark-demo 2 workers ready after \d+\.\d s"
            r" \(framework: 2 workers registered with the Spark master \(local backend\)\)", summaries[1])
        # The phase gives back the 2 workers it found; RestoreCluster then restores the baseline.
        assert summaries[2].endswith("restored to 2 workers (as found)")
        assert summaries[3].startswith("restore: spark/spark-demo 2 -> 0 workers (baseline) in")
        assert _gone(state)
        assert not list((state / "local" / "clusters").glob("*/cluster.json"))
    finally:
        take_down(state)


@pytest.mark.slow
@pytest.mark.starts_ray
def test_readme_ray_snippet_is_the_ray_example_and_runs_end_to_end_on_local_ray(tmp_path):
    from flytekitplugins_ddlscale.backends.local._ray_ops import RAY_TEMP_PREFIX

    readme = (ROOT / "README.md").read_text()
    snippets = [block.split("```\n", 1)[0] for block in readme.split("```python\n")[1:]]
    ray_snippets = [snippet for snippet in snippets if "cluster=\"ray/" in snippet]
    example = (ROOT / "examples" / "ray_local.py").read_text()
    assert ray_snippets and all(snippet in example for snippet in ray_snippets)
    state = tmp_path / "state"
    # Ray's socket paths do not fit under tmp_path, so the cluster's Ray files go to a new folder in the temp
    # folder (ray_ops.temp_dir); Ray tests run one at a time (their lane), so a new one is this run's.
    ray_folders_before = set(Path(tempfile.gettempdir()).glob(RAY_TEMP_PREFIX + "*"))
    done = subprocess.run([str(PYFLYTE), "run", "examples/ray_local.py", "train_flow"], cwd=ROOT,
                          env=quick_start_env(state), capture_output=True, text=True, timeout=900)
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        loss = sum(1.0 / (s + 1) for s in range(8))
        assert float(done.stdout.strip().splitlines()[-1]) == pytest.approx(1.0 / loss)
        summaries = [line for line in done.stderr.splitlines() if ": ray/demo " in line]
        assert [line.split(":")[0] for line in summaries] == ["scale_up", "scale_down", "evaluate"], done.stderr
        assert "client_builder" not in done.stderr and "SIGTERM handler" not in done.stderr, "Ray's chatter shows"
        assert re.fullmatch(r"scale_up: ray/demo 0 -> 2 workers ready on Medium in \d+\.\d s(?: \(\d+\.\d s waiting\))?"
                            r" \(framework: 2 workers registered with the Ray head \(local backend\)\)", summaries[0])
        assert re.match(r"evaluate: ray/demo 0 -> 1 worker ready in \d+\.\d s", summaries[2])
        assert summaries[2].endswith("restored to 0 workers (as found)")
        # The flow created the cluster, so restoring its baseline took it down: no Ray process is left.
        assert not list((state / "local" / "clusters").glob("*/cluster.json"))
        assert processes_mentioning(str(state), environment=True) == []
        assert set(Path(tempfile.gettempdir()).glob(RAY_TEMP_PREFIX + "*")) - ray_folders_before == set()
    finally:
        take_down(state)


def run_on_a_terminal(command, env, columns=80, timeout=300.0) -> tuple:
    """Run ``command`` on a real pseudo-terminal of ``columns`` columns; return (exit code, output)."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(command, cwd=ROOT, env=dict(env, TERM="xterm", COLUMNS=str(columns)),
                            stdin=child, stdout=child, stderr=child, close_fds=True)
    os.close(child)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=max(1.0, deadline - time.monotonic())), output.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)


@pytest.mark.slow
def test_quick_start_on_an_80_column_terminal_shows_the_bar_for_each_wait(tmp_path):
    state = tmp_path / "state"
    try:
        code, output = run_on_a_terminal(QUICK_START, quick_start_env(state))
        plain = ANSI.sub("", output)
        lines = [part for line in plain.split("\n") for part in line.split("\r") if part.strip()]
        assert code == 0, plain[-3000:]
        # The bar names the node and the full cluster, and says what it waits for.
        assert any("workers_ready dask/hybrid-demo: waiting for 2" in line for line in lines), plain[-3000:]
        assert any("check_in_phase dask/hybrid-demo: waiting for 2" in line and "0/2" in line for line in lines)
        assert not any(" seen " in line for line in lines)
        assert max(len(line.rstrip()) for line in lines if "━" in line or "/2 " in line) <= 80
        # Summary lines start on lines of their own, after the bar.
        assert any(line.startswith("check_in_phase: dask/hybrid-demo 0 -> 2 workers ready in") for line in lines)
        assert "True" in [line.strip() for line in lines]
    finally:
        take_down(state)


@pytest.mark.parametrize("module, workflow", [("ray_domino", "ray_training"), ("spark_domino", "spark_etl")])
def test_domino_examples_serialize_with_their_settings(module, workflow, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    mod = __import__(module)
    wf = get_serializable(OrderedDict(), SETTINGS, getattr(mod, workflow)).template
    from flytekit.core.base_task import PythonTask

    tasks = {t.name: t for t in vars(mod).values() if isinstance(t, PythonTask)}
    types = set()
    for node in wf.nodes:
        task = tasks[node.task_node.reference_id.name]
        template = get_serializable(OrderedDict(), SETTINGS, task).template
        types.add(template.type)
        if template.type.startswith("ddlscale"):
            assert template.custom["cluster"] in ("ray", "spark")
    assert {"ddlscale_scale", "python-task"} <= types


@pytest.mark.slow
def test_ctrl_c_in_a_node_based_flow_says_what_was_left_running_and_how_to_stop_it(tmp_path):
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [str(PYFLYTE), "run", "tests/flyte_apps/interrupted.py", "flow"],
        cwd=ROOT, env=quick_start_env(state), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        err_lines = []
        for line in proc.stderr:  # bounded by the node's own 120 s timeout, and by the kill below
            err_lines.append(line)
            if line.startswith("scale_up: dask/interrupt-test 0 -> 1 worker ready"):
                break
        assert err_lines and err_lines[-1].startswith("scale_up:"), "".join(err_lines)
        time.sleep(1.0)  # let long_stage start
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
        assert proc.returncode != 0
        assert "ddlscale: interrupted; left running by this flow:" in rest, rest[-3000:]
        assert "dask/interrupt-test: Running, 1 worker; to stop it: ddlscale local down --name interrupt-test" in rest
        assert processes_mentioning(str(state)) != []
        stopped = subprocess.run([str(PYFLYTE.with_name("ddlscale")), "local", "down", "--name", "interrupt-test"],
                                 env=quick_start_env(state), capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert processes_mentioning(str(state)) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        take_down(state)
    assert processes_mentioning(str(state)) == []


def test_every_deck_the_docs_and_examples_turn_on_leaves_out_flytekit_s_pip_list_deck():
    """flytekit's default Decks include one that runs `pip list` ("No module named pip" in a uv venv)."""
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*.py")),
             *sorted((ROOT / "tests" / "flyte_apps").glob("*.py"))]
    bare = [f"{path.relative_to(ROOT)}: {line.strip()}" for path in texts for line in path.read_text().splitlines()
            if re.match(r"\s*@task\(.*enable_deck=True", line) and "deck_fields" not in line]
    assert bare == []


def _needs_flyte2():
    return pytest.importorskip("flyte", reason="the Flyte 2 examples need the flyte2 extra")


@pytest.mark.slow
def test_flyte2_example_prewarms_checks_its_dask_workers_in_the_phase_restores_and_leaves_nothing(tmp_path):
    _needs_flyte2()
    state = tmp_path / "state"
    done = subprocess.run([sys.executable, "examples/flyte2_local.py"], cwd=ROOT, env=quick_start_env(state),
                          capture_output=True, text=True, timeout=300)
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert done.stdout.strip().splitlines()[-1] == str(sum(x * x for x in range(1000)))
        summaries = [line for line in done.stderr.splitlines() if re.match(r"\w+: dask/flyte2-demo \d", line)]
        assert [line.split(":")[0] for line in summaries] == ["prewarm", "check_workers", "restore"], done.stderr
        assert summaries[0] == "prewarm: dask/flyte2-demo 0 -> 2 workers requested, not waited for"
        assert "2 workers registered with the Dask scheduler" in summaries[1]
        assert summaries[1].endswith("restored to 2 workers (as found)")
        assert summaries[2].startswith("restore: dask/flyte2-demo 2 -> 0 workers (baseline) in")
        assert processes_mentioning(str(state)) == []
        assert not list((state / "local" / "clusters").glob("*/cluster.json"))
    finally:
        take_down(state)


@pytest.mark.slow
def test_flyte2_counterpart_of_the_quick_start_runs_the_same_steps_with_the_same_summaries(tmp_path):
    _needs_flyte2()
    state = tmp_path / "state"
    done = subprocess.run([sys.executable, "examples/flyte2_hybrid_flow.py", "5000"], cwd=ROOT,
                          env=quick_start_env(state), capture_output=True, text=True, timeout=300)
    try:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert done.stdout.strip().splitlines()[-1] == "True"
        summaries = [line for line in done.stderr.splitlines() if ": dask/hybrid-demo " in line]
        # The steps and lines of the flytekit quick start (test_quick_start_runs_end_to_end_...).
        assert [line.split(":")[0] for line in summaries] == [
            "request_workers", "workers_ready", "scale_down", "check_in_phase"
        ], done.stderr
        assert summaries[0] == "request_workers: dask/hybrid-demo 0 -> 2 workers requested, not waited for"
        assert re.fullmatch(r"workers_ready: dask/hybrid-demo 2 workers ready after \d+\.\d s"
                            r" \(framework: 2 workers registered with the Dask scheduler.*\)", summaries[1])
        assert summaries[3].endswith("restored to 0 workers (as found)")
        assert processes_mentioning(str(state)) == []
        assert not list((state / "local" / "clusters").glob("*/cluster.json"))
    finally:
        take_down(state)

"""Importing the plugin changes nothing in the process; redaction starts when something of ours runs.

flytekit imports every ``flytekit.plugins`` entry point at start-up, so each flytekit user's process
imports this package: the import must leave the log record factory, the signal handlers, the threads
and the ``atexit`` hooks as they were. Each check runs in a fresh interpreter (a subprocess), where
nothing imported the package before.
"""
import json
import subprocess
import sys
import textwrap

from flytekitplugins_ddlscale._core.redaction import MASK

SNAPSHOT = textwrap.dedent("""
    import atexit, json, logging, signal, sys, threading
    SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCHLD", "SIGPIPE", "SIGALRM")

    def describe(handler):
        return f"{getattr(handler, '__module__', '')}.{getattr(handler, '__qualname__', handler)}"

    def snapshot():
        return {
            "factory": describe(logging.getLogRecordFactory()),
            "signals": {name: describe(signal.getsignal(getattr(signal, name))) for name in SIGNALS},
            "threads": sorted(thread.name for thread in threading.enumerate()),
            "atexit": atexit._ncallbacks(),
        }
""")


def _run(body: str) -> dict:
    ran = subprocess.run([sys.executable, "-c", SNAPSHOT + textwrap.dedent(body)], capture_output=True, text=True,
                         timeout=240)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.strip().splitlines()[-1])


def test_importing_the_package_and_every_public_name_changes_no_process_wide_state():
    seen = _run("""
        before = snapshot()
        import flytekitplugins_ddlscale as package
        after_package = snapshot()
        import flytekit  # what the public names import anyway, measured apart from ours
        with_flytekit = snapshot()
        for name in package.__all__:
            getattr(package, name)  # every lazily loaded module: tasks, phase, backends, helpers
        import flytekitplugins_ddlscale.cli
        print(json.dumps({"before": before, "package": after_package, "flytekit": with_flytekit,
                          "everything": snapshot()}))
    """)
    assert seen["package"] == seen["before"]
    assert seen["everything"] == seen["flytekit"]
    assert seen["before"]["factory"] == "logging.LogRecord"


def test_importing_flytekit_with_the_plugin_installed_changes_what_flytekit_alone_changes():
    """The same start-up with the plugin's entry point neutralised (a placeholder module in its place, as
    benchmarks/bench_import.py measures it) is the baseline: flytekit's own changes (its SIGINT handler, an
    atexit hook) are in both, the plugin adds none."""
    without = _run("""
        import types
        for name in ("flytekitplugins_ddlscale", "flytekitplugins_ddlscale.connector_entry"):
            sys.modules[name] = types.ModuleType(name)
        import flytekit
        print(json.dumps(snapshot()))
    """)
    seen = _run("""
        before = snapshot()
        import flytekit
        print(json.dumps({"before": before, "after": snapshot(),
                          "loaded": hasattr(sys.modules.get("flytekitplugins_ddlscale"), "ClusterRef")}))
    """)
    assert seen["loaded"], "flytekit did not load the plugin through its entry point"
    assert seen["after"] == without
    assert seen["after"]["factory"] == seen["before"]["factory"] == "logging.LogRecord"


def test_a_backend_starts_redaction_of_every_logger_of_ours():
    seen = _run("""
        import logging
        from flytekitplugins_ddlscale._core.redaction import register_secret
        from flytekitplugins_ddlscale.backends.local import LocalBackend
        import tempfile
        register_secret("s3cr3t-import-1")
        before = logging.getLogRecordFactory()("httpx", logging.INFO, "", 0, "key %s", ("s3cr3t-import-1",), None)
        LocalBackend(state_dir=tempfile.mkdtemp())
        after = logging.getLogRecordFactory()("httpx", logging.INFO, "", 0, "key %s", ("s3cr3t-import-1",), None)
        print(json.dumps({"before": before.getMessage(), "after": after.getMessage()}))
    """)
    assert seen == {"before": "key s3cr3t-import-1", "after": f"key {MASK}"}


def test_a_log_call_whose_arguments_do_not_fit_its_format_does_not_raise_from_our_factory():
    """Another library's bug is logging's to report when the record is handled (``--- Logging error ---`` on
    stderr), as without the plugin; the call itself returns, and masking goes on."""
    script = textwrap.dedent("""
        import logging, sys
        from flytekitplugins_ddlscale._core.redaction import install_redaction, register_secret
        logging.basicConfig(stream=sys.stdout, format="%(name)s %(message)s")
        install_redaction()
        register_secret("s3cr3t-import-2")
        logging.getLogger("httpx").warning("%s and %s", "one")
        logging.getLogger("flytekitplugins_ddlscale.local").warning("%d", "not a number")
        logging.getLogger("httpx").warning("still masked: %s", "s3cr3t-import-2")
    """)
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr.count("--- Logging error ---") == 2, ran.stderr
    assert "not enough arguments for format string" in ran.stderr and "format: a real number is required" in ran.stderr
    assert ran.stdout == f"httpx still masked: {MASK}\n"

"""Credentials never reach logs, errors, Decks, task outputs or CLI output; TLS is verified by default.

Every test sends real credentials to the scaler test server (and checks that
the server received them, so the search is not vacuous), turns logging up to
DEBUG everywhere, including httpx and httpcore, and searches everything a
user could see: log records, the process's stdout/stderr, every exception's
str/repr/args/notes/traceback text, Deck HTML, task outputs and CLI output.
"""
import asyncio
import glob
import json
import logging
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List

import pytest
from click.testing import CliRunner
from flyteidl.core.execution_pb2 import TaskExecution
from flytekit import FlyteContextManager, task, workflow
from rel_proxy import FaultProxy
from rel_secrets import exception_texts, leaks
from rel_tls import self_signed_cert, server_context

from flytekitplugins_ddlscale import (
    CertificateRefusedError,
    ClusterRef,
    ScaleCluster,
    ScalingError,
    distributed_phase,
    get_backend,
)
from flytekitplugins_ddlscale.backends.scaler import ScalerOptions
from tests.servers.scaler_server import DEFAULT_USER, OTHER_USER, ScalerTestServer

NAME = "ray-secrets"
REF = ClusterRef("ray", NAME)
LOGGERS = ("", "httpx", "httpcore", "flytekit", "flytekitplugins_ddlscale")


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """DEBUG logging everywhere, captured by caplog and also written to stderr as basicConfig would."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    previous = {name: logging.getLogger(name).level for name in LOGGERS}
    for name in LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name or None)
    logging.getLogger().addHandler(handler)
    flytekit_logger = logging.getLogger("flytekit")
    flytekit_logger.addHandler(handler)
    yield caplog
    logging.getLogger().removeHandler(handler)
    flytekit_logger.removeHandler(handler)
    for name, level in previous.items():
        logging.getLogger(name).setLevel(level)


@pytest.fixture
def cluster(scaler_server: ScalerTestServer) -> ClusterRef:
    scaler_server.add_cluster("ray", NAME, replicas=1, max_replicas=6)
    scaler_server.add_cluster("ray", "ray-foreign", replicas=1, max_replicas=6, owner=OTHER_USER)
    scaler_server.add_cluster("spark", "spark-secrets", replicas=1, max_replicas=6)
    return REF


@pytest.fixture
def secret_key(scaler_server: ScalerTestServer, monkeypatch: pytest.MonkeyPatch, scaler_env) -> str:
    """A fresh API key of the clusters' owner, given as ``$DOMINO_API_KEY``."""
    key = "sk-live-" + secrets.token_hex(16)
    scaler_server.add_user(DEFAULT_USER, api_key=key)
    monkeypatch.setenv("DOMINO_API_KEY", key)
    return key


@pytest.fixture
def secret_token(scaler_server: ScalerTestServer, monkeypatch: pytest.MonkeyPatch, scaler_env) -> str:
    """A fresh bearer token of the clusters' owner, given as ``$DOMINO_TOKEN``."""
    token = "eyJ-token-" + secrets.token_hex(16)
    scaler_server.add_user(DEFAULT_USER, token=token)
    monkeypatch.delenv("DOMINO_API_KEY")
    monkeypatch.setenv("DOMINO_TOKEN", token)
    return token


def sent_credentials(server: ScalerTestServer) -> List[str]:
    """Every credential value the server received (API keys and bearer tokens)."""
    found = set()
    for request in server.requests:
        if request.headers.get("x-domino-api-key"):
            found.add(request.headers["x-domino-api-key"])
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            found.add(auth[7:].strip())
    return sorted(found)


def failures(*calls: Callable[[], Any]) -> List[BaseException]:
    """Run each call and collect what it raised; every call must raise a ScalingError."""
    raised: List[BaseException] = []
    for call in calls:
        with pytest.raises(ScalingError) as caught:
            call()
        raised.append(caught.value)
    return raised


def exercise(backend: Any, server: ScalerTestServer) -> List[BaseException]:
    """Successful calls and one of each kind of failure; returns the failures."""
    backend.get_state(REF)
    backend.scale(REF, 3, wait=True, timeout=10)
    backend.restart_head(REF, wait=True, timeout=10)
    backend.restore_baseline(REF, wait=True, timeout=10)

    def burst() -> None:
        server.inject_faults("status", 10, status=503, path="/cluster/")
        try:
            backend.get_state(REF)
        finally:
            server.clear_faults()

    def server_error() -> None:
        server.inject_faults("status", 1, status=500, path="/scale/")
        backend.scale(REF, 2, wait=False)

    def slow() -> None:
        server.inject_faults("delay", 10, delay=1.0, path="/cluster/")
        try:
            backend.get_state(REF)
        finally:
            server.clear_faults()

    def never_ready() -> None:
        server.set_pod_ready_delay(30.0)
        try:
            backend.scale(REF, 4, wait=True, timeout=0.3)
        finally:
            server.set_pod_ready_delay(0.0)

    return failures(
        burst,
        server_error,
        slow,
        never_ready,
        lambda: backend.get_state(ClusterRef("ray", "ray-missing")),
        lambda: backend.scale(ClusterRef("ray", "ray-foreign"), 2, wait=False),
        lambda: backend.restart_head(ClusterRef("spark", "spark-secrets"), wait=False),
        lambda: backend.scale(REF, 2, "No Such Tier", wait=False),
    )


def everything_seen(caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture, errors: List[BaseException]) -> List[str]:
    out, err = capfd.readouterr()
    texts = [caplog.text, out, err] + [r.getMessage() for r in caplog.records] + [repr(r.args) for r in caplog.records]
    for error in errors:
        texts += exception_texts(error)
    return texts


def assert_debug_logs_were_on(caplog: pytest.LogCaptureFixture) -> None:
    names = {r.name for r in caplog.records if r.levelno == logging.DEBUG}
    assert any(n.startswith("httpcore") for n in names), names


# ----- backend calls, errors and logs -----


def test_api_key_never_in_logs_or_errors(scaler_server, cluster, secret_key, debug_logs, capfd):
    backend = get_backend("scaler", options=ScalerOptions(timeout=0.5, retries=1))
    try:
        errors = exercise(backend, scaler_server)
    finally:
        backend.close()
    assert sent_credentials(scaler_server) == [secret_key]
    assert_debug_logs_were_on(debug_logs)
    assert leaks([secret_key], everything_seen(debug_logs, capfd, errors)) == []


def test_bearer_token_never_in_logs_or_errors(scaler_server, cluster, secret_token, debug_logs, capfd):
    backend = get_backend("scaler", options=ScalerOptions(timeout=0.5, retries=1))
    try:
        errors = exercise(backend, scaler_server)
    finally:
        backend.close()
    assert sent_credentials(scaler_server) == [secret_token]
    assert leaks([secret_token], everything_seen(debug_logs, capfd, errors)) == []


def test_proxy_tokens_never_in_logs_or_errors(scaler_server, cluster, scaler_env, monkeypatch, debug_logs, capfd):
    monkeypatch.delenv("DOMINO_API_KEY")
    monkeypatch.setenv("DOMINO_API_PROXY", scaler_server.url)
    backend = get_backend("scaler", options=ScalerOptions(timeout=0.5, retries=1))
    try:
        errors = exercise(backend, scaler_server)
        scaler_server.inject_faults("status", 1, status=401, path="/cluster/")
        backend.get_state(REF)  # refreshed once: a second token
        scaler_server.expire_tokens()
        backend.get_state(REF)  # expired: refreshed again
    finally:
        backend.close()
    tokens = sent_credentials(scaler_server)
    assert len(tokens) >= 3, tokens
    assert_debug_logs_were_on(debug_logs)
    assert leaks(tokens, everything_seen(debug_logs, capfd, errors)) == []


def test_connection_failures_never_show_credentials(
    scaler_server, cluster, secret_key, debug_logs, capfd
):
    with FaultProxy.before(scaler_server.url) as proxy:
        backend = get_backend("scaler", base_url=proxy.url, options=ScalerOptions(timeout=0.5, retries=1))
        try:
            backend.get_state(REF)
            proxy.cut_all()
            # Every connection from now on: whether a reset lands before the request is sent (safe to send
            # again, so ridden out until the call's deadline) or after (not) is the scheduler's choice.
            proxy.reset_next(1_000_000)
            errors = failures(lambda: backend.get_state(REF), lambda: backend.restart_head(REF, timeout=2.0))
            proxy.go_down()
            errors += failures(lambda: backend.scale(REF, 2, timeout=1.0))  # rides out the outage, then times out
        finally:
            backend.close()
    assert sent_credentials(scaler_server) == [secret_key]
    assert leaks([secret_key], everything_seen(debug_logs, capfd, errors)) == []


@pytest.mark.parametrize("name", ["scaler", "kubernetes", "local"])
def test_every_plugin_logger_masks_registered_secrets(secret_key, debug_logs, capfd, name):
    from flytekitplugins_ddlscale._core.redaction import register_secret

    register_secret(secret_key)
    logging.getLogger(f"flytekitplugins_ddlscale.{name}").warning("request failed: %s", f"X-Domino-Api-Key {secret_key}")
    assert leaks([secret_key], everything_seen(debug_logs, capfd, [])) == []


# ----- Flyte surfaces: task outputs, Decks, phase errors -----


scale_task = ScaleCluster("rel_secret_scale", cluster=f"ray/{NAME}", replicas=3, timeout=20)
foreign_scale_task = ScaleCluster("rel_secret_foreign", cluster="ray/ray-foreign", replicas=3, timeout=20)


@task(enable_deck=True)
@distributed_phase(cluster=f"ray/{NAME}", replicas=2, timeout=20, framework_ready=False)
def secret_phase_body(x: int) -> int:
    return x + 1


@workflow
def secret_wf() -> int:
    scale_task()
    return secret_phase_body(x=1)


@workflow
def foreign_wf() -> None:
    foreign_scale_task()


def deck_pages(since: float) -> List[str]:
    """Deck HTML files flytekit's local execution wrote since ``since``."""
    sandbox = FlyteContextManager.current_context().file_access.local_sandbox_dir
    paths = [p for p in glob.glob(os.path.join(sandbox, "**", "deck.html"), recursive=True) if os.path.getmtime(p) >= since]
    return [Path(p).read_text(encoding="utf-8") for p in paths]


def test_task_outputs_decks_records_and_task_errors_never_show_credentials(
    scaler_server, cluster, secret_key, debug_logs, capfd, clean_env
):
    started = time.time()
    outcome = scale_task()
    records = [p.read_text(encoding="utf-8") for p in clean_env.rglob("*.json")]
    assert records, "the ScaleCluster node's baseline record should be on disk"
    result = secret_wf()
    with pytest.raises(Exception) as caught:
        foreign_wf()
    pages = deck_pages(started)
    assert len(pages) >= 2, "expected the scaling node's and the phase's Decks"
    assert any("svg" in page for page in pages)
    assert result == 2
    texts = [repr(outcome), json.dumps(vars(outcome), default=str), *pages, *records]
    texts += everything_seen(debug_logs, capfd, [caught.value])
    assert sent_credentials(scaler_server) == [secret_key]
    assert leaks([secret_key], texts) == []


# ----- CLI -----


def test_cli_output_never_shows_credentials(scaler_server, cluster, secret_key, debug_logs, capfd):
    from flytekitplugins_ddlscale.cli import main

    runner = CliRunner()
    outputs = []
    for argv, code in [
        (["status", "--kind", "ray", "--name", NAME, "--json"], 0),
        (["scale", "--kind", "ray", "--name", NAME, "--replicas", "3", "--json"], 0),
        (["restart-head", "--kind", "ray", "--name", NAME], 0),
        (["restore", "--kind", "ray", "--name", NAME, "--json"], 0),
        (["status", "--kind", "ray", "--name", "ray-foreign"], 5),
        (["scale", "--kind", "ray", "--name", "ray-missing", "--replicas", "2", "--json"], 4),
        (["restart-head", "--kind", "spark", "--name", "spark-secrets", "--json"], 1),
    ]:
        result = runner.invoke(main, argv)
        assert result.exit_code == code, (argv, result.output)
        outputs += [result.output, *exception_texts(result.exception if code else None)]
    scaler_server.inject_faults("status", 20, status=503)
    result = runner.invoke(main, ["status", "--kind", "ray", "--name", NAME, "--json"])
    assert result.exit_code == 6, result.output
    outputs.append(result.output)
    assert sent_credentials(scaler_server) == [secret_key]
    assert leaks([secret_key], outputs + everything_seen(debug_logs, capfd, [])) == []


# ----- TLS -----


@pytest.fixture
def tls_proxy(scaler_server: ScalerTestServer, tmp_path: Path) -> Iterator[FaultProxy]:
    """The scaler test server behind TLS with a self-signed certificate for 127.0.0.1."""
    cert, key = self_signed_cert(tmp_path)
    with FaultProxy.before(scaler_server.url, tls=server_context(cert, key)) as proxy:
        yield proxy


def test_tls_is_verified_by_default(scaler_server, cluster, tls_proxy, secret_key, debug_logs, capfd):
    backend = get_backend("scaler", base_url=tls_proxy.url, options=ScalerOptions(timeout=2.0, retries=0))
    try:
        with pytest.raises(CertificateRefusedError, match="TLS certificate was refused") as caught:
            backend.get_state(REF)
    finally:
        backend.close()
    assert tls_proxy.accepted >= 1  # a TLS handshake was attempted and refused by the client
    assert scaler_server.requests == []  # so the credentials never left the client
    assert leaks([secret_key], everything_seen(debug_logs, capfd, [caught.value])) == []


def test_tls_verification_explicit_opt_out_works(scaler_server, cluster, tls_proxy, secret_key):
    backend = get_backend("scaler", base_url=tls_proxy.url, options=ScalerOptions(verify=False, timeout=2.0))
    try:
        assert backend.get_state(REF).desired_workers == 1
    finally:
        backend.close()
    assert scaler_server.count("GET", "/cluster/") == 1


def test_tls_of_the_api_proxy_is_verified_by_default(scaler_server, cluster, tls_proxy, scaler_env, monkeypatch):
    monkeypatch.delenv("DOMINO_API_KEY")
    monkeypatch.setenv("DOMINO_API_PROXY", tls_proxy.url)
    backend = get_backend("scaler", options=ScalerOptions(timeout=2.0, retries=0))
    try:
        with pytest.raises(CertificateRefusedError) as caught:
            backend.get_state(REF)
    finally:
        backend.close()
    assert "access token" in str(caught.value) and "TLS certificate was refused" in str(caught.value)
    assert scaler_server.count("GET", "/access-token") == 0
    assert scaler_server.count("GET", "/cluster/") == 0

    opted_out = get_backend("scaler", options=ScalerOptions(verify=False, timeout=2.0))
    try:
        assert opted_out.get_state(REF).desired_workers == 1
    finally:
        opted_out.close()
    assert scaler_server.count("GET", "/access-token") == 1


# ----- Flyte connector -----


def test_connector_metadata_messages_and_errors_never_show_credentials(
    scaler_server, cluster, secret_key, debug_logs, capfd
):
    from collections import OrderedDict

    from flytekit import FlyteContextManager
    from flytekit.configuration import Image, ImageConfig, SerializationSettings
    from flytekit.core.type_engine import TypeEngine
    from flytekit.tools.translator import get_serializable

    from flytekitplugins_ddlscale.connector import ScalingConnector

    settings = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="img", tag="1")))
    template = get_serializable(OrderedDict(), settings, scale_task).template
    ctx = FlyteContextManager.current_context()
    connector = ScalingConnector(template.type)

    def literals(**values: Any) -> Any:
        return TypeEngine.dict_to_literal_map(ctx, values, {k: scale_task.python_interface.inputs[k] for k in values})

    scaler_server.set_pod_ready_delay(0.3)
    meta = connector.create(template, inputs=literals(replicas=3))
    texts = [meta.encode().decode("utf-8", "replace"), repr(meta)]
    resource = asyncio.run(connector.get(meta))
    texts.append(str(resource.message))
    time.sleep(0.5)
    texts.append(repr(asyncio.run(connector.get(meta))))
    for bad in (literals(cluster="ray/ray-foreign", replicas=2), literals(cluster="ray/ray-missing", replicas=2)):
        # A typed error refuses the node: create answers a refused metadata, its get FAILED with the one line.
        refused = connector.create(template, inputs=bad)
        answer = asyncio.run(connector.get(refused))
        assert answer.message.startswith(("[unauthorized]", "[not_found]")) and answer.message == refused.error
        texts += [refused.encode().decode("utf-8", "replace"), repr(refused), answer.message]
    assert sent_credentials(scaler_server) == [secret_key]
    assert leaks([secret_key], texts + everything_seen(debug_logs, capfd, [])) == []


def test_password_in_the_service_url_never_in_logs_or_errors(scaler_server, cluster, secret_key, debug_logs, capfd):
    password = "url-pass-" + secrets.token_hex(8)
    url = scaler_server.url.replace("http://", f"http://proxyuser:{password}@")
    backend = get_backend("scaler", base_url=url, options=ScalerOptions(timeout=0.5, retries=1))
    try:
        backend.get_state(REF)
        scaler_server.stop()
        errors = failures(lambda: backend.get_state(REF))
    finally:
        backend.close()
    assert leaks([password, secret_key], everything_seen(debug_logs, capfd, errors)) == []

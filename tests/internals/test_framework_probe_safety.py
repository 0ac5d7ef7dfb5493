"""What a readiness probe will not do, whatever URL it is given: follow a redirect, echo what the
other end answered, or carry credentials from the URL into messages and logs.

Real HTTP servers on 127.0.0.1 (and one raw TCP service) play the far end.
"""
import logging
import socket
import threading
from typing import Dict, List

import pytest

from flytekitplugins_ddlscale.errors import InvalidInputError
from flytekitplugins_ddlscale._framework import PROBES, resolve_endpoint
from flytekitplugins_ddlscale._core.validation import validate_url
from flytekitplugins_ddlscale._framework.endpoints import Endpoint
from flytekitplugins_ddlscale._framework.wait import HeadUnreachable, read_registered
from flytekitplugins_ddlscale.tasks import ScaleCluster
from tests.port_support import free_port
from tests.servers.status_http import Reply, StatusServer

SECRET_BODY = "internal-only-4711"
PASSWORD = "pw-s3cret-9876"


class Scripted(StatusServer):
    """Answers every GET with the reply the test set."""

    def __init__(self, reply: Reply) -> None:
        super().__init__()
        self.reply = reply

    def route(self, path: str, query: Dict[str, List[str]]) -> Reply:
        return self.reply


class Banner:
    """A TCP service that is not HTTP: sends one line and closes, like an SSH or SMTP server."""

    def __init__(self, line: bytes) -> None:
        self.line = line
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(self.line)

    def __enter__(self) -> "Banner":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
        self.thread.join(timeout=5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"


def read(kind: str, url: str) -> int:
    return read_registered(PROBES[kind], Endpoint(kind, url, "test"), timeout=5.0)


@pytest.mark.parametrize("scheme", ["http", "ftp"])
def test_a_redirect_is_reported_not_followed(scheme):
    with Scripted((200, {"workers": 3}, {})) as target:
        where = f"{target.url}/json/counts.json" if scheme == "http" else f"ftp://127.0.0.1:{free_port()}/x"
        with Scripted((302, None, {"Location": where})) as head:
            with pytest.raises(HeadUnreachable, match="HTTP 302 redirect .* not followed"):
                read("dask", head.url)
            assert head.requests == ["/json/counts.json"]
        assert target.requests == []


def test_nothing_of_a_failed_answer_reaches_the_message():
    failures = []
    with Scripted((200, {"result": False, "msg": SECRET_BODY}, {})) as head:
        with pytest.raises(HeadUnreachable) as raised:
            read("ray", head.url)
        failures.append(str(raised.value))
    with Scripted((500, {"detail": SECRET_BODY}, {})) as head:
        with pytest.raises(HeadUnreachable) as raised:
            read("dask", head.url)
        failures.append(str(raised.value))
    with Banner(f"SSH-2.0-{SECRET_BODY}\r\n".encode()) as service:
        with pytest.raises(HeadUnreachable) as raised:
            read("dask", service.url)
        failures.append(str(raised.value))
    assert failures[2].startswith("BadStatusLine: not an HTTP answer")
    for text in failures:
        assert SECRET_BODY not in text


@pytest.mark.parametrize("url", [f"http://admin:{PASSWORD}@127.0.0.1:8787", f"https://{PASSWORD}@head:8265/"])
def test_credentials_in_a_framework_url_are_refused_and_masked(url, caplog):
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(InvalidInputError) as raised:
            validate_url(url)
        with pytest.raises(InvalidInputError) as from_node:
            ScaleCluster("with_password", cluster="dask/pw", replicas=1, framework_url=url)
    for error in (raised.value, from_node.value):
        assert error.field == "framework_url" and "credentials in the URL" in str(error)
        assert PASSWORD not in str(error) and PASSWORD not in repr(error.value) and "***@" in str(error)
    assert PASSWORD not in caplog.text


def test_credentials_in_an_override_variable_name_the_variable():
    env = {"DDLSCALE_DASK_URL": f"http://admin:{PASSWORD}@127.0.0.1:8787"}
    with pytest.raises(InvalidInputError, match="DDLSCALE_DASK_URL") as raised:
        resolve_endpoint("dask", env=env)
    assert PASSWORD not in str(raised.value)

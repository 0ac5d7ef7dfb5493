"""The DCO's validating admission webhook, served to the envtest tier's real API server.

Domino's operator registers a validating webhook for its cluster objects
(docs/kubernetes.md: ``minReplicas >= 1``, ``minReplicas <= maxReplicas``,
``worker.replicas >= 0``, worker cpu and memory requests). The rules are the
test server's (``tests/servers/k8s_rules.webhook_problems``); here they run
behind a real ``ValidatingWebhookConfiguration``: the API server sends an
``AdmissionReview`` over TLS (the serving certificate of the control plane,
trusted through ``caBundle``) on every create and update of the four kinds,
and reports a refusal itself. What this checks is the API server's side:
which requests reach a webhook and how its refusal reaches the client.
"""
import base64
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Optional

from tests.servers.k8s_rules import webhook_denial, webhook_name, webhook_problems

from flytekitplugins_ddlscale.backends._support.crds import CRD_GROUP, CRD_VERSION, LAYOUTS


def review_answer(review: Dict[str, Any]) -> Dict[str, Any]:
    """The ``AdmissionReview`` answer to ``review``: allowed, or refused 422 Invalid with the webhook's message."""
    request = review.get("request") or {}
    obj = request.get("object") or {}
    problems = webhook_problems(obj) if obj else []
    response: Dict[str, Any] = {"uid": request.get("uid", ""), "allowed": not problems}
    if problems:
        kind = (request.get("kind") or {}).get("kind") or obj.get("kind", "")
        response["status"] = {"code": 422, "reason": "Invalid", "message": webhook_denial(obj, kind, problems)}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - no access log on stderr
        return

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        data = json.dumps(review_answer(json.loads(self.rfile.read(length) or b"{}"))).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class DcoWebhook:
    """An HTTPS server on 127.0.0.1 answering the API server's admission reviews, and its registration."""

    def __init__(self, certs: Path) -> None:
        self.certs = certs
        self._httpd: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "DcoWebhook":
        """Serve on a free port, presenting the control plane's serving certificate."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.certs / "serving.crt"), str(self.certs / "serving.key"))
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.1,), name="envtest-dco-webhook",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def register(self, api_client: Any) -> None:
        """Create the ValidatingWebhookConfiguration: one webhook per DCO kind, on create and update."""
        from kubernetes import client

        assert self._httpd is not None, "start the webhook first"
        url = f"https://127.0.0.1:{self._httpd.server_address[1]}/validate"
        bundle = base64.b64encode((self.certs / "ca.crt").read_bytes()).decode()
        hooks = [{
            "name": webhook_name(info.crd_kind),
            "clientConfig": {"url": url, "caBundle": bundle},
            "rules": [{"apiGroups": [CRD_GROUP], "apiVersions": [CRD_VERSION], "operations": ["CREATE", "UPDATE"],
                       "resources": [info.plural], "scope": "Namespaced"}],
            "sideEffects": "None", "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "timeoutSeconds": 10,
        } for info in LAYOUTS.values() if info.flavour == "dco"]
        client.AdmissionregistrationV1Api(api_client).create_validating_webhook_configuration({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "distributed-compute-operator"}, "webhooks": hooks,
        })

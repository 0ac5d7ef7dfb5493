"""A real Kubernetes control plane on 127.0.0.1 for the envtest tier: etcd, kube-apiserver, kube-controller-manager.

The two Kubernetes binaries come packed (``kube-apiserver.xz``,
``kube-controller-manager.xz``) from the folder named by
``$DDLSCALE_ENVTEST_DIR``; they are unpacked once into
``~/.cache/ddlscale-envtest/<sha256 of the packed files>`` and reused. etcd is
the distribution's (``apt-get install etcd-server``, ``/usr/bin/etcd``).

:class:`ControlPlane` starts the three processes on free loopback ports with
a fresh data directory, RBAC on and two static-token users:

- ``admin`` (group ``system:masters``): everything;
- :data:`USER`, named as the service account the shipped RoleBinding
  (``examples/k8s/rbac.yaml``) binds, with no rights until a test applies
  that Role and RoleBinding.

It writes a kubeconfig for each (TLS verified against a CA made here) and
stops every process it started when closed. The API server writes every
request of :data:`USER` (and only that user's) to :attr:`ControlPlane.audit_log`
(JSON lines, metadata only): what the benchmarks count a client's requests
and open watches by. :meth:`ControlPlane.stop_apiserver`
and :meth:`ControlPlane.start_apiserver` restart the API server on the same
port, as an upgrade does (for a control plane of its own: the session's is shared).
"""
import datetime
import hashlib
import ipaddress
import json
import lzma
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

from tests.port_support import free_port, free_ports

ENV_DIR = "DDLSCALE_ENVTEST_DIR"
"""Names the folder holding ``kube-apiserver.xz`` and ``kube-controller-manager.xz``."""
BINARIES = ("kube-apiserver", "kube-controller-manager")
USER = "system:serviceaccount:domino-compute:flyte-runner"
"""The non-admin user: the subject of the shipped RoleBinding (a service account's user name)."""
CONTROLLERS = "deployment,replicaset,statefulset,garbagecollector,namespace"
"""Controllers the tier needs: StatefulSets make the DCO stand-in's pods; the rest as an operator's objects need."""
START_TIMEOUT = 60.0
POOL = 32
"""Connections an API client of :meth:`ControlPlane.api_client` keeps open."""
SUITE = Path(__file__).resolve().parents[2]
SUITE_ENV = "DDLSCALE_ENVTEST_SUITE"
"""Set to :data:`SUITE` (the repository holding these tests) in every process started here, so a CI
run on a shared machine tells its own leftover processes from other checkouts' (``.ci/run``)."""


class ControlPlaneError(RuntimeError):
    """A process of the control plane failed to start or answer; the message carries its log's tail."""


def missing_requirements() -> List[str]:
    """Why the tier cannot run here (empty when it can): the variable, the packed binaries, etcd."""
    reasons = []
    folder = os.environ.get(ENV_DIR)
    if not folder:
        reasons.append(f"${ENV_DIR} is not set (the folder holding kube-apiserver.xz and kube-controller-manager.xz)")
    else:
        absent = [f"{name}.xz" for name in BINARIES if not (Path(folder) / f"{name}.xz").is_file()]
        if absent:
            reasons.append(f"${ENV_DIR}={folder} lacks {', '.join(absent)}")
    if etcd_binary() is None:
        reasons.append("etcd is not installed (apt-get install etcd-server)")
    return reasons


def etcd_binary() -> Optional[str]:
    """The etcd executable: on PATH, else the Debian package's ``/usr/bin/etcd``; None when absent."""
    found = shutil.which("etcd")
    if found:
        return found
    return "/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None


def unpacked_binaries(folder: Path, cache_root: Optional[Path] = None) -> Dict[str, Path]:
    """``{name: executable}`` for :data:`BINARIES`, unpacked from ``folder`` into the cache (reused when present).

    The cache folder is named after the packed files' SHA-256, so new binaries
    get a new folder; a file is written under a temporary name and renamed,
    so a concurrent run never sees half of one.
    """
    digest = hashlib.sha256()
    for name in BINARIES:
        with open(folder / f"{name}.xz", "rb") as packed:
            for block in iter(lambda: packed.read(1 << 20), b""):
                digest.update(block)
    root = cache_root or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ddlscale-envtest"
    target = root / digest.hexdigest()[:16]
    target.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in BINARIES:
        path = target / name
        if not path.exists():
            partial = target / f".{name}.{os.getpid()}.part"
            with lzma.open(folder / f"{name}.xz") as source, open(partial, "wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
            partial.chmod(0o755)
            partial.replace(path)
        paths[name] = path
    return paths


def _write_certificates(directory: Path) -> None:
    """A CA, a serving certificate for 127.0.0.1 signed by it, and the service-account key pair."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import NameOID

    def pem_key(key: Any) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ddlscale-envtest-ca")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    serving = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "serving.crt").write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    (directory / "serving.key").write_bytes(pem_key(key))
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (directory / "sa.key").write_bytes(pem_key(sa_key))
    (directory / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def stop_process(process: "subprocess.Popen[Any]", grace: float = 10.0) -> None:
    """Stop ``process`` if it runs: SIGTERM, then SIGKILL after ``grace`` seconds; wait for it to end."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


SETPRIV = shutil.which("setpriv")
"""util-linux's ``setpriv``: sets the parent-death signal and execs, so a process spawned while gRPC's
threads run (a restart under the connector tests' driver) needs no ``preexec_fn``: a forked child
running Python code there crashes now and then (SIGSEGV, SIGABRT) in gRPC's fork handlers."""


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the test process dies, so a killed run leaves nothing behind."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
    # A watch then gives two events: ResponseStarted when it opens, ResponseComplete when it ends.
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": [USER]}, {"level": "None"}],
}
"""Audit the non-admin user's requests only: the fake kubelet and the stand-ins (admin) cost nothing."""


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager on 127.0.0.1; use as a context manager.

    ``folder`` holds the packed binaries; ``work`` (default: a new temporary
    folder, removed on close) takes the data, certificates, logs, the audit
    log and the two kubeconfigs (:attr:`admin_kubeconfig`, :attr:`user_kubeconfig`).
    ``pod_watch_cache`` False (the test tier's choice) makes pod watches read
    etcd, so :meth:`compact` makes older versions answer 410 at once; True
    keeps the API server's default, as on a real cluster (the benchmarks').
    """

    def __init__(self, folder: Path, work: Optional[Path] = None, cache_root: Optional[Path] = None,
                 pod_watch_cache: bool = False) -> None:
        self.folder = Path(folder)
        self.pod_watch_cache = pod_watch_cache
        self._own_work = work is None
        self.work = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix="ddlscale-envtest-"))
        self.cache_root = cache_root
        self.admin_token = secrets.token_hex(16)
        self.user_token = secrets.token_hex(16)
        self.port = 0
        self.etcd_url = ""
        self.processes: Dict[str, subprocess.Popen] = {}

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> "ControlPlane":
        """Start etcd, the API server (waits for ``/readyz``), then the controller-manager; raises
        :class:`ControlPlaneError` with the log's tail when one fails (everything started is stopped)."""
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        binaries = unpacked_binaries(self.folder, self.cache_root)
        etcd = etcd_binary()
        if etcd is None:
            raise ControlPlaneError("etcd is not installed (apt-get install etcd-server)")
        certs = self.work / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        _write_certificates(certs)
        (self.work / "audit-policy.json").write_text(json.dumps(AUDIT_POLICY))
        (self.work / "tokens.csv").write_text(
            f'{self.admin_token},admin,admin-uid,"system:masters"\n'
            f'{self.user_token},{USER},user-uid,"system:serviceaccounts,system:serviceaccounts:domino-compute"\n'
        )
        client_port, peer_port = free_ports(2)
        peer = f"http://127.0.0.1:{peer_port}"
        self._spawn("etcd", [
            etcd, "--name", "envtest", "--data-dir", str(self.work / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{client_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{client_port}",
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"envtest={peer}",
        ])
        self._wait_http("etcd", f"http://127.0.0.1:{client_port}/health", None)
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        self.port = free_port()
        self._apiserver_argv = [
            str(binaries["kube-apiserver"]), f"--etcd-servers=http://127.0.0.1:{client_port}",
            "--bind-address=127.0.0.1", f"--secure-port={self.port}", "--advertise-address=10.255.255.1",
            "--endpoint-reconciler-type=none", f"--cert-dir={certs}",
            f"--tls-cert-file={certs / 'serving.crt'}", f"--tls-private-key-file={certs / 'serving.key'}",
            f"--token-auth-file={self.work / 'tokens.csv'}", "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={certs / 'sa.pub'}",
            f"--service-account-signing-key-file={certs / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16", "--disable-admission-plugins=ServiceAccount",
            f"--audit-policy-file={self.work / 'audit-policy.json'}", f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
        ]
        if not self.pod_watch_cache:
            # Pod watches read etcd itself instead of the API server's cache, so compact() makes older
            # versions answer 410 Gone at once, as a long-running cluster's do (the cache would replay them).
            self._apiserver_argv.append("--watch-cache-sizes=pods#0")
        self._spawn("kube-apiserver", self._apiserver_argv)
        self._wait_http("kube-apiserver", f"{self.url}/readyz", self.admin_token)
        self.admin_kubeconfig = self._kubeconfig("admin", self.admin_token)
        self.user_kubeconfig = self._kubeconfig("user", self.user_token)
        self._spawn("kube-controller-manager", [
            str(binaries["kube-controller-manager"]), f"--kubeconfig={self.admin_kubeconfig}",
            "--leader-elect=false", "--secure-port=0", f"--controllers={CONTROLLERS}",
        ])

    def close(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL after 10 s) and remove the work folder if it is ours."""
        for name in reversed(list(self.processes)):
            stop_process(self.processes.pop(name))
        if self._own_work:
            shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- what tests use ----------------------------------------------------
    @property
    def audit_log(self) -> Path:
        """The API server's audit log: one JSON event per request of :data:`USER` (see :data:`AUDIT_POLICY`)."""
        return self.work / "audit.log"

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>`` of the API server."""
        return f"https://127.0.0.1:{self.port}"

    def api_client(self, admin: bool = True) -> Any:
        """A ``kubernetes.client.ApiClient`` for the admin (or the non-admin user); the caller closes it.

        Its pool keeps :data:`POOL` connections: the stand-ins sharing the admin's send several requests at
        once beside their watches, and a smaller pool would drop and re-open (TLS) connections."""
        from kubernetes import client, config

        configuration = client.Configuration()
        path = self.admin_kubeconfig if admin else self.user_kubeconfig
        config.load_kube_config(config_file=str(path), client_configuration=configuration)
        configuration.connection_pool_maxsize = POOL
        return client.ApiClient(configuration)

    def compact(self) -> int:
        """Compact etcd up to its current revision (what the API server does every 5 minutes): a pod watch
        from any earlier resourceVersion then gets 410 Gone. Returns the revision."""
        def call(path: str, body: Dict[str, Any]) -> Dict[str, Any]:
            request = urllib.request.Request(f"{self.etcd_url}{path}", data=json.dumps(body).encode(), method="POST")
            with urllib.request.urlopen(request, timeout=10) as answer:
                return json.loads(answer.read())

        revision = int(call("/v3/kv/range", {"key": "Lw=="})["header"]["revision"])  # any key: the header counts
        call("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def stop_apiserver(self) -> None:
        """Stop the API server (SIGTERM, as a rolling upgrade does; SIGKILL after 10 s): clients get
        "connection refused" until :meth:`start_apiserver`."""
        stop_process(self.processes.pop("kube-apiserver"))

    def start_apiserver(self, ready: bool = False) -> None:
        """Start the API server again on the same port with the same flags and data; returns once it
        listens (``ready``: once ``/readyz`` answers 200). Call it from a thread that lives as long as the
        plane (the main thread): the new process gets SIGTERM when the thread that started it ends."""
        self._spawn("kube-apiserver", self._apiserver_argv)
        if ready:
            self._wait_http("kube-apiserver", f"{self.url}/readyz", self.admin_token)
            return
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            self.check_running()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.02)
        raise ControlPlaneError(f"kube-apiserver did not listen again within {START_TIMEOUT:.0f} s")

    def check_running(self) -> None:
        """Raise :class:`ControlPlaneError` naming a process that has exited, with its log's tail."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise ControlPlaneError(f"{name} exited with status {process.returncode}: {self._tail(name)}")

    # -- internals ---------------------------------------------------------
    def _spawn(self, name: str, argv: List[str]) -> None:
        log = open(self.work / f"{name}.log", "ab")  # appended: a restarted process keeps the earlier log
        # The parent-death signal fires when the spawning THREAD ends (see start_apiserver).
        prefix = [SETPRIV, "--pdeathsig", "TERM", "--"] if SETPRIV else []
        try:
            self.processes[name] = subprocess.Popen(
                prefix + argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.work,
                env=dict(os.environ, **{SUITE_ENV: str(SUITE)}), preexec_fn=None if SETPRIV else _die_with_parent,
            )
        finally:
            log.close()

    def _tail(self, name: str) -> str:
        try:
            return (self.work / f"{name}.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def _wait_http(self, name: str, url: str, token: Optional[str]) -> None:
        """Poll ``url`` until it answers 200, for at most :data:`START_TIMEOUT` seconds."""
        context = ssl.create_default_context(cafile=str(self.work / "certs" / "ca.crt"))
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        deadline = time.monotonic() + START_TIMEOUT
        last = "no answer"
        while time.monotonic() < deadline:
            self.check_running()
            try:
                secure = context if url.startswith("https") else None
                with urllib.request.urlopen(request, timeout=2, context=secure) as answer:
                    if answer.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.1)
        raise ControlPlaneError(
            f"{name} did not answer 200 at {url} within {START_TIMEOUT:.0f} s (last: {last}): {self._tail(name)}"
        )

    def _kubeconfig(self, who: str, token: str) -> Path:
        path = self.work / f"{who}.kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": who,
            "clusters": [{"name": "envtest", "cluster": {
                "server": self.url, "certificate-authority": str(self.work / "certs" / "ca.crt")}}],
            "users": [{"name": who, "user": {"token": token}}],
            "contexts": [{"name": who, "context": {"cluster": "envtest", "user": who}}],
        }))
        return path

"""A TCP proxy on 127.0.0.1 that puts network faults between a client and a test server.

The test servers fault at the HTTP level (status codes, dropped answers,
delays). This proxy adds what only the network can do: refuse connections
(nothing listening on the port, as while a service restarts), reset them
(RST right after accept), cut every open connection at once, and terminate
TLS with a certificate the test made, so the client's TLS verification is
exercised against a real handshake.

Usage::

    with FaultProxy.before(server.url) as proxy:
        client_url = proxy.url
        proxy.go_down()      # connection refused from now on, open connections cut
        proxy.come_up()      # listening again on the same port
        proxy.outage(3.0)    # down for 3 s, then up again (blocks; ``down_at``/``up_at`` record when)
        proxy.reset_next(3)  # the next 3 connections are reset right after accept
        proxy.hang()         # connections stay open but nothing is forwarded any more
"""
import select
import socket
import ssl
import struct
import threading
import time
from typing import List, Optional, Tuple
from urllib.parse import urlsplit

_CHUNK = 65536


class FaultProxy:
    """Forwards connections from ``url`` to ``upstream``, with faults switched on by the test."""

    def __init__(self, upstream: Tuple[str, int], *, tls: Optional[ssl.SSLContext] = None) -> None:
        self.upstream = upstream
        self._tls = tls
        self._lock = threading.Lock()
        self._listener: Optional[socket.socket] = None
        self._held: Optional[socket.socket] = None
        """The port, bound but not listening, while the proxy is down."""
        self._accept_thread: Optional[threading.Thread] = None
        self._pipes: List[threading.Thread] = []
        self._open: List[socket.socket] = []
        self._upstreams: List[socket.socket] = []
        self._reset_next = 0
        self._stopping = threading.Event()
        self._hanging = threading.Event()
        self.port = 0
        self.accepted = 0
        """Connections accepted so far (including reset ones)."""
        self.down_at: Optional[float] = None
        """``time.monotonic()`` when the last :meth:`outage` began."""
        self.up_at: Optional[float] = None
        """``time.monotonic()`` when the last :meth:`outage` ended (listening again)."""
        self.refused_while_down = 0

    @classmethod
    def before(cls, url: str, *, tls: Optional[ssl.SSLContext] = None) -> "FaultProxy":
        """A proxy in front of the test server at ``url`` (``http://host:port``)."""
        parts = urlsplit(url)
        return cls((parts.hostname or "127.0.0.1", int(parts.port or 80)), tls=tls)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (``https://`` when terminating TLS)."""
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> "FaultProxy":
        """Listen on an ephemeral port (or the same port again after :meth:`go_down`)."""
        listener, self._held = self._held, None
        if listener is None:
            listener = self._bound(self.port)
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._stopping.clear()
        self._listener = listener
        self._accept_thread = threading.Thread(target=self._accept_loop, args=(listener,), name="fault-proxy", daemon=True)
        self._accept_thread.start()
        return self

    @staticmethod
    def _bound(port: int, reuse_addr: bool = True) -> socket.socket:
        # SO_REUSEPORT lets a second, non-listening socket hold the port while the listener closes. That
        # one leaves SO_REUSEADDR off: with it, any other SO_REUSEADDR socket could bind beside it.
        bound = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if reuse_addr:
            bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        bound.bind(("127.0.0.1", port))
        return bound

    def go_down(self, hold_port: bool = True) -> None:
        """Stop listening and cut every open connection: clients now get 'connection refused'. The port
        stays bound (not listening) until :meth:`come_up`, so no other socket can take it meanwhile."""
        self._stopping.set()
        listener, self._listener = self._listener, None
        if listener is not None:
            if hold_port and self._held is None:
                self._held = self._bound(self.port, reuse_addr=False)
            listener.close()
        if self._accept_thread is not None:
            self._accept_thread.join(5)
        self._cut_all()

    def come_up(self) -> None:
        """Listen again on the same port."""
        self.start()

    def outage(self, seconds: float) -> None:
        """Refuse connections (and cut open ones) for ``seconds``, then listen again; blocks meanwhile."""
        self.down_at = time.monotonic()
        self.go_down()
        time.sleep(max(0.0, self.down_at + seconds - time.monotonic()))
        self.come_up()
        self.up_at = time.monotonic()

    def stop(self) -> None:
        """Stop listening, cut connections, free the port and join every proxy thread."""
        self.go_down(hold_port=False)
        held, self._held = self._held, None
        if held is not None:
            held.close()
        for pipe in list(self._pipes):
            pipe.join(5)

    def reset_next(self, count: int) -> None:
        """Reset the next ``count`` accepted connections (RST instead of an answer)."""
        with self._lock:
            self._reset_next += count

    def hang(self, hanging: bool = True) -> None:
        """Stop (or resume) forwarding bytes on every connection, as a hung service or network does."""
        if hanging:
            self._hanging.set()
        else:
            self._hanging.clear()

    def cut_all(self) -> None:
        """Cut every open connection now (as a service restart does), keep listening."""
        self._cut_all()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _cut_all(self) -> None:
        # Clients see their connections reset; the server behind sees them closed, as when a
        # proxy in front of it restarts (a reset there only makes the test server print tracebacks).
        with self._lock:
            clients, self._open = self._open, []
            upstreams, self._upstreams = self._upstreams, []
        for sock in upstreams:
            _close(sock)
        for sock in clients:
            _reset(sock)

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                ready, _, _ = select.select([listener], [], [], 0.05)
                if not ready:
                    continue
                client, _ = listener.accept()
            except (OSError, ValueError):
                return
            with self._lock:
                self.accepted += 1
                reset = self._reset_next > 0
                if reset:
                    self._reset_next -= 1
            if reset:
                _reset(client)
                continue
            pipe = threading.Thread(target=self._serve, args=(client,), name="fault-proxy-pipe", daemon=True)
            with self._lock:
                self._pipes = [p for p in self._pipes if p.is_alive()] + [pipe]
            pipe.start()

    def _serve(self, client: socket.socket) -> None:
        try:
            if self._tls is not None:
                client.settimeout(5)
                client = self._tls.wrap_socket(client, server_side=True)
                client.settimeout(None)
            upstream = socket.create_connection(self.upstream, timeout=5)
        except (OSError, ssl.SSLError):
            _close(client)
            return
        with self._lock:
            self._open.append(client)
            self._upstreams.append(upstream)
        try:
            _pump(client, upstream, self._stopping, self._hanging)
        finally:
            _close(client)
            _close(upstream)


def _pump(a: socket.socket, b: socket.socket, stopping: threading.Event, hanging: threading.Event) -> None:
    peers = {a: b, b: a}
    while not stopping.is_set():
        if hanging.is_set():
            stopping.wait(0.05)
            continue
        pending = [s for s in (a, b) if isinstance(s, ssl.SSLSocket) and s.pending()]
        try:
            readable = pending or select.select([a, b], [], [], 0.05)[0]
        except (OSError, ValueError):
            return
        for sock in readable:
            try:
                data = sock.recv(_CHUNK)
            except (OSError, ssl.SSLError):
                return
            if not data:
                return
            try:
                peers[sock].sendall(data)
            except OSError:
                return


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass

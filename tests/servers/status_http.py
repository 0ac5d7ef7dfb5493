"""Shared machinery of the framework-head test servers (Ray dashboard, Spark master).

A :class:`StatusServer` serves JSON on 127.0.0.1, holds a list of workers
that join at times the test chooses (:meth:`join_after`), and can go away
and come back on the same port (:meth:`outage`) to play a head that restarts.
Subclasses build the real endpoint's payload from :meth:`workers_now`.
"""
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, urlsplit


@dataclass
class Worker:
    """One worker: registered from ``joins_at`` (monotonic) until ``dies_at``."""

    worker_id: str
    host: str
    joins_at: float
    dies_at: Optional[float] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    def alive(self, now: float) -> bool:
        return self.joins_at <= now and (self.dies_at is None or now < self.dies_at)

    def known(self, now: float) -> bool:
        return self.joins_at <= now


Reply = Tuple[int, Any, Dict[str, str]]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class StatusServer:
    """Base class: routes GETs to :meth:`route`, which returns ``(status, payload, headers)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workers: List[Worker] = []
        self._httpd: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self._port = 0
        self.requests: List[str] = []

    # ----- lifecycle -----

    def start(self) -> "StatusServer":
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                with owner._lock:
                    owner.requests.append(self.path)
                refusal = owner.refuse(self.headers)
                if refusal is not None:
                    text = refusal[1].encode()
                    self.send_response(refusal[0])
                    self.send_header("Content-Type", "text/plain; charset=utf-8")
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    self.wfile.write(text)
                    return
                status, payload, headers = owner.route(parts.path, parse_qs(parts.query))
                body = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                if payload is not None:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = _Server(("127.0.0.1", self._port), Handler)
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._httpd = None

    def outage(self, seconds: float) -> threading.Thread:
        """Stop answering now (connection refused) and come back on the same port after ``seconds``.

        Meanwhile the port stays held by a socket that is bound but not listening (a connection to it
        is refused), so no other socket of a busy machine takes it and the head can come back there.
        """
        self.stop()
        held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", self._port))

        def back() -> None:
            time.sleep(seconds)
            held.close()
            self.start()

        thread = threading.Thread(target=back, daemon=True)
        thread.start()
        return thread

    def __enter__(self) -> "StatusServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL of the head, e.g. ``http://127.0.0.1:54321``."""
        return f"http://127.0.0.1:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    # ----- workers -----

    def join_after(self, *delays: float) -> List[Worker]:
        """Workers that register ``delays`` seconds from now (one per delay)."""
        now = time.monotonic()
        with self._lock:
            start = len(self._workers)
            added = [
                Worker(f"worker-{start + i}", f"10.0.0.{start + i + 10}", now + delay)
                for i, delay in enumerate(delays)
            ]
            self._workers.extend(added)
        return added

    def join_at(self, moments: List[float]) -> None:
        """Replace every worker by workers joining at the given monotonic ``moments``."""
        with self._lock:
            self._workers = [Worker(f"worker-{i}", f"10.0.0.{i + 10}", at) for i, at in enumerate(moments)]

    def kill(self, count: int) -> None:
        """The first ``count`` alive workers die now (they stay listed as dead)."""
        now = time.monotonic()
        with self._lock:
            for worker in [w for w in self._workers if w.alive(now)][:count]:
                worker.dies_at = now

    def leave_after(self, count: int, delay: float) -> float:
        """The first ``count`` alive workers die ``delay`` seconds from now (a scale-down's workers the
        head has not dropped yet); returns that monotonic moment."""
        now = time.monotonic()
        with self._lock:
            for worker in [w for w in self._workers if w.alive(now)][:count]:
                worker.dies_at = now + delay
        return now + delay

    def workers_now(self) -> Tuple[float, List[Worker]]:
        """``(now, workers that have joined so far)``, alive or dead."""
        now = time.monotonic()
        with self._lock:
            return now, [w for w in self._workers if w.known(now)]

    def alive_count(self) -> int:
        """Workers registered now: what the framework itself would say."""
        now, workers = self.workers_now()
        return sum(1 for w in workers if w.alive(now))

    def last_join(self) -> Optional[float]:
        """Monotonic time the last scheduled worker joins (None without workers)."""
        with self._lock:
            return max((w.joins_at for w in self._workers), default=None)

    def refuse(self, headers: Any) -> Optional[Tuple[int, str]]:
        """``(status, text)`` refusing a request with these headers before it is routed; None lets it
        through (every request, by default)."""
        return None

    def route(self, path: str, query: Dict[str, List[str]]) -> Reply:
        raise NotImplementedError



"""Whether the other end of a loopback connection is this user's, checked before a secret is sent (any local
user may bind a free loopback port): on Linux the connection's row in ``/proc/net/tcp`` names the uid that
accepted it. Elsewhere, and for a peer off loopback, nothing is checked."""
import http.client
import ipaddress
import os
import socket
import sys
import urllib.request
from pathlib import Path
from typing import Any, Optional, Tuple, Union

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_Endpoint = Tuple[Union[ipaddress.IPv4Address, ipaddress.IPv6Address], int]
_UID_FIELD = 7


class ForeignListenerError(ConnectionRefusedError):
    """A loopback port we meant to send a secret to is held by another user's process (or by no one
    we can name): nothing was sent."""


def _endpoint(text: str) -> _Endpoint:
    """``0100007F:1F90`` (a ``/proc/net/tcp`` address: the IP in 32-bit words of host byte order) as (ip, port)."""
    hex_ip, hex_port = text.split(":")
    raw = bytes.fromhex(hex_ip)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return _normal(ipaddress.ip_address(raw), int(hex_port, 16))


def _normal(host: Union[str, ipaddress.IPv4Address, ipaddress.IPv6Address], port: int) -> _Endpoint:
    """(address, port), an IPv4-mapped IPv6 address as its IPv4 one."""
    address = ipaddress.ip_address(host.split("%", 1)[0]) if isinstance(host, str) else host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address, port


def peer_uid(sock: socket.socket) -> Optional[int]:
    """The uid owning the other end of the connected loopback TCP socket ``sock``; None when the
    kernel does not say (not Linux, not loopback, or the connection is gone)."""
    try:
        ours = _normal(*sock.getsockname()[:2])
        theirs = _normal(*sock.getpeername()[:2])
    except (OSError, ValueError):
        return None
    if not theirs[0].is_loopback:
        return None
    for table in _TABLES:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            try:
                if _endpoint(fields[1]) == theirs and _endpoint(fields[2]) == ours:
                    return int(fields[_UID_FIELD])
            except (IndexError, ValueError):
                continue
    return None


def check_own_peer(sock: socket.socket, what: str) -> None:
    """Raise :class:`ForeignListenerError` unless the other end of ``sock`` (connected, on loopback)
    belongs to this user; a peer off loopback is not checked. ``what`` names it in the message."""
    try:
        host = sock.getpeername()[0]
        if not _normal(host, 0)[0].is_loopback:
            return
    except (OSError, ValueError):
        return
    uid = peer_uid(sock)
    if uid != os.geteuid():
        owner = "an unknown user" if uid is None else f"uid {uid}"
        raise ForeignListenerError(f"{what} on {host}:{sock.getpeername()[1]} is held by {owner}, not by you: nothing sent")


class _OwnPeerConnection(http.client.HTTPConnection):
    """An HTTP connection that, once connected to a loopback port, checks the listener is ours."""

    def connect(self) -> None:
        super().connect()
        try:
            check_own_peer(self.sock, "the server")
        except ForeignListenerError:
            self.close()
            raise


class _OwnPeerHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_OwnPeerConnection, req)


class NoRedirects(urllib.request.HTTPRedirectHandler):
    """Refuses every redirect, so a 3xx surfaces as an ``HTTPError`` instead of a request elsewhere."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def own_peer_opener() -> urllib.request.OpenerDirector:
    """A ``urllib`` opener for requests carrying a secret: ``http://`` to a loopback host sends
    nothing (:class:`ForeignListenerError`, an ``OSError``) unless this user's process accepted the
    connection; redirects are not followed."""
    return urllib.request.build_opener(_OwnPeerHandler(), NoRedirects())

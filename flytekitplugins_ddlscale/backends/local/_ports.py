"""Ports for the processes of a local cluster, chosen here and bound by those processes moments later.

A port is chosen outside the kernel's range for outgoing connections
(``/proc/sys/net/ipv4/ip_local_port_range``), below it (from
:data:`LOWEST`) or above it: a client socket of any
program on the machine takes its local port from that range, and one that
lands on the chosen port between the choice and the bind makes the bind
fail (Spark's daemons then exit, as they are told not to move to another
port). Only a server binding that very port explicitly can still take it.
"""
import random
import socket
from pathlib import Path
from typing import AbstractSet, Tuple

OUTGOING_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000
"""Lowest port chosen: below it lie the ports services are commonly configured on, and Ray's default
range for its worker processes (10002-19999), where Ray refuses to find any other of its ports."""
TRIES = 200
"""Random ports probed outside the outgoing range before one the kernel assigns is taken instead."""
_PICK = random.SystemRandom()
"""Draws from the operating system: the user's own ``random`` sequence is left as it was."""


def outgoing_range() -> Tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux's default where unreadable)."""
    try:
        low, high = (int(part) for part in OUTGOING_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def port_is_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound right now (nothing else listens there)."""
    return _bindable(host, port, reuse_address=True)


def _bindable(host: str, port: int, reuse_address: bool) -> bool:
    # Without SO_REUSEADDR a port any socket holds (a connection's, one closing) counts as taken.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        if reuse_address:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str, avoid: AbstractSet[int] = frozenset()) -> int:
    """A port no socket holds right now, not in ``avoid``, drawn outside the outgoing range: from
    :data:`LOWEST` up to it, or above it up to 65535 (one the kernel assigns, inside the range, only when
    :data:`TRIES` draws find none free); its user binds it moments later."""
    low, high = outgoing_range()
    below = range(LOWEST, low) if low > LOWEST else range(0)
    above = range(high + 1, 65536)
    candidates = [*below, *above]
    for _ in range(TRIES if candidates else 0):
        port = _PICK.choice(candidates)
        if port not in avoid and _bindable(host, port, reuse_address=False):
            return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            port = int(probe.getsockname()[1])
        if port not in avoid:
            return port

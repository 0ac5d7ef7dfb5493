"""Free loopback ports for servers a test starts in another process."""
import contextlib
import socket
from typing import List


def free_ports(count: int) -> List[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 now. Each is held until all are chosen: the OS may
    hand a port it just gave out to the next bind, and a server given the same port twice fails to start."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


def free_port() -> int:
    """One TCP port free on 127.0.0.1 now."""
    return free_ports(1)[0]

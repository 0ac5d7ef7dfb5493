"""Ports for a local cluster's processes: outside the range outgoing connections take theirs from (below it from 20000, or above it)."""
import random
import socket

from flytekitplugins_ddlscale.backends.local._supervisor import LOWEST, free_port, outgoing_range


def test_a_port_is_chosen_outside_the_outgoing_range_and_can_be_bound():
    low, high = outgoing_range()
    assert low > LOWEST, "this machine leaves no room below its outgoing range"
    chosen = {free_port("127.0.0.1") for _ in range(20)}
    assert all(LOWEST <= port < low or port > high for port in chosen), sorted(chosen)
    assert len(chosen) > 1  # drawn, not a fixed port another cluster's process would share
    for port in chosen:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", port))


def test_a_port_held_by_a_socket_or_avoided_is_not_chosen():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", free_port("127.0.0.1")))
        held = holder.getsockname()[1]
        low, _ = outgoing_range()
        avoided = set(range(LOWEST, low)) - {held}
        # Only the held port is left below the range: the choice goes above it, or to the kernel's.
        assert free_port("127.0.0.1", avoided) != held


def test_choosing_leaves_the_user_s_random_sequence_as_it_was():
    random.seed(7)
    expected = [random.random() for _ in range(3)]
    random.seed(7)
    free_port("127.0.0.1")
    assert [random.random() for _ in range(3)] == expected


def test_ports_above_the_outgoing_range_are_chosen_too():
    """docs/local.md: from 20000 up to the outgoing range, or above it up to 65535. With every port below the
    range avoided, the port chosen lies above it, not inside it where the kernel assigns outgoing ports."""
    low, high = outgoing_range()
    assert high < 65535, "this machine leaves no room above its outgoing range"
    below = frozenset(range(LOWEST, low))
    chosen = {free_port("127.0.0.1", below) for _ in range(5)}
    assert all(high < port <= 65535 for port in chosen), sorted(chosen)

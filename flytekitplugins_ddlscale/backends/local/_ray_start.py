"""``RAY_PYTHON ray_start.py start ...``: Ray's ``ray start`` with the node held to loopback.

Ray binds its servers (GCS, raylet, object manager, core workers, the
dashboard agent, the runtime env agent, the metrics exporters, the client
server) to loopback only when the node's IP address is a loopback address;
for any other node IP they listen on every interface or on that IP. But
``ray start`` deliberately replaces ``--node-ip-address 127.0.0.1`` and a
``127.0.0.1`` ``--address`` with the machine's LAN address, so every local
node listened beyond loopback. This runs Ray's own command line with two
changes, in this process only:

* ``resolve_ip_for_localhost`` keeps a loopback address as given;
* multi-node clusters stay allowed: the node's processes run with
  ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (set by the driver), which makes
  their own address look-ups (e.g. the client server's per-client servers
  reading the GCS address) answer loopback, but would also make
  ``ray start --address`` refuse to join a head.

If the installed Ray lacks either hook, it refuses to start the node (exit
status 3, saying why) rather than start one open to the network. Run as a
script with the Python of the ``ray`` command, so the plugin is not imported.
"""
import sys
from typing import List

LOOPBACK = ("127.0.0.1", "::1", "localhost")
REFUSED = 3


def main(argv: List[str]) -> int:
    """Run ``ray`` with ``argv`` (``start ...``) as described above; 3 when Ray cannot be held to loopback."""
    try:
        from ray._private import ray_constants, services
        from ray.scripts.scripts import main as ray_main
    except ImportError as exc:
        print(f"ray_start: cannot import Ray's command line ({exc})", file=sys.stderr)
        return REFUSED
    resolve = getattr(services, "resolve_ip_for_localhost", None)
    if resolve is None or not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):
        print(
            "ray_start: refusing to start a Ray node: this Ray version has no "
            "ray._private.services.resolve_ip_for_localhost or ray_constants.ENABLE_RAY_CLUSTER, "
            "so its node cannot be held to 127.0.0.1 and would listen on the network",
            file=sys.stderr,
        )
        return REFUSED

    def keep_loopback(host: str) -> str:
        return host if host in LOOPBACK else resolve(host)

    services.resolve_ip_for_localhost = keep_loopback
    ray_constants.ENABLE_RAY_CLUSTER = True
    sys.argv = ["ray", *argv]
    return int(ray_main() or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A resolver fault one process can have: names under ``.ddlscale-test`` resolve through a file.

Python imports ``sitecustomize`` at start-up from its path, so a process
started with this folder on ``PYTHONPATH`` and ``$DDLSCALE_TEST_HOSTS``
naming a file of ``name address`` lines resolves those names from the file,
read at every lookup: a test removes a line and the name stops resolving
(``EAI_NONAME``, as when DNS fails), puts it back and it resolves again. No
other name, process, ``/etc/hosts`` or DNS server is touched.
"""
import os
import socket

SUFFIX = ".ddlscale-test"
_system_lookup = socket.getaddrinfo


def _table(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as lines:
            return dict(line.split()[:2] for line in lines if len(line.split()) >= 2)
    except OSError:
        return {}


def _lookup(host, *args, **kwargs):  # type: ignore[no-untyped-def]
    name = host.decode() if isinstance(host, bytes) else host
    if isinstance(name, str) and name.rstrip(".").endswith(SUFFIX):
        address = _table(os.environ["DDLSCALE_TEST_HOSTS"]).get(name.rstrip("."))
        if address is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return _system_lookup(address, *args, **kwargs)
    return _system_lookup(host, *args, **kwargs)


if os.environ.get("DDLSCALE_TEST_HOSTS"):
    socket.getaddrinfo = _lookup

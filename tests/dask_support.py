"""Asking a plain ``tcp://`` Dask scheduler the tests started (not the local backend's, which speaks TLS
and lists its workers in a file) which workers it has registered."""
import asyncio
from typing import Any, Dict, Optional


def scheduler_workers(address: str, timeout: float = 3.0) -> Optional[Dict[str, Dict[str, Any]]]:
    """Workers the scheduler at ``address`` sees, by worker name (its ``identity`` call over Dask's own
    comm); None if it does not answer within ``timeout``."""
    from distributed.core import rpc

    async def identity() -> Dict[str, Any]:
        async with rpc(address, timeout=timeout) as remote:
            return await asyncio.wait_for(remote.identity(), timeout)

    try:
        info = asyncio.run(identity())
    except (OSError, asyncio.TimeoutError):
        # distributed's CommClosedError is an OSError: all mean "not answering".
        return None
    return {str(w["name"]): w for w in info.get("workers", {}).values()}

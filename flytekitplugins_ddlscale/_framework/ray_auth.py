"""The ``Authorization`` header a Ray head with token authentication expects, found as Ray finds it.

Ray's token authentication is on when ``RAY_AUTH_MODE=token``; the token is
``$RAY_AUTH_TOKEN``, else the contents of the file ``$RAY_AUTH_TOKEN_PATH``,
else of ``~/.ray/auth_token``. A local Ray cluster hands user code the mode
and the path of its token file (never the token itself), so the framework
check reads the dashboard with the same credentials ``ray.init`` uses.
"""
from pathlib import Path
from typing import Dict, Mapping, Optional

from .._core import settings


def ray_token(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The token Ray would send under ``environ`` (default: this process's), or None when token
    authentication is off or no token is found."""
    mode = settings.RAY_AUTH_MODE.value(env=environ)
    if (mode or "").lower() != "token":
        return None
    token = settings.RAY_AUTH_TOKEN.value(env=environ)
    if token:
        return token
    path = settings.RAY_AUTH_TOKEN_PATH.value(env=environ)
    try:
        token = Path(path or Path.home() / ".ray" / "auth_token").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return token or None


def ray_auth_headers(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """``{"Authorization": "Bearer <token>"}`` for :func:`ray_token`, or no header."""
    token = ray_token(environ)
    return {"Authorization": f"Bearer {token}"} if token else {}

"""Backend for Domino's cluster scaler service (``ddl-cluster-scaler``), over HTTP with httpx."""
from ._backend import ScalerServiceBackend
from ._client import BASE_URL_ENV, DEFAULT_BASE_URL, ScalerClient, ScalerOptions

__all__ = ["BASE_URL_ENV", "DEFAULT_BASE_URL", "ScalerClient", "ScalerOptions", "ScalerServiceBackend"]

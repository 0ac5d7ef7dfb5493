"""Where the backend's API client and tier catalog come from.

In a pod (``$KUBERNETES_SERVICE_HOST`` set) the service account's in-cluster
config is used unless a kubeconfig is given; elsewhere the kubeconfig
(``kubeconfig`` path or ``$KUBECONFIG`` / ``~/.kube/config``) and ``context``.
"""
import os
from typing import Any, Optional

from ...errors import BackendUnavailableError, InvalidInputError
from ...redaction import register_secret
from ...tiers import DominoTierCatalog, FileTierCatalog, TierCatalog

TIERS_FILE_ENV = "DDLSCALE_TIERS_FILE"
API_PROXY_ENV = "DOMINO_API_PROXY"


def make_api_client(kubeconfig: Optional[str], context: Optional[str], in_cluster: Optional[bool]) -> Any:
    """A ``kubernetes.client.ApiClient`` from in-cluster config or a kubeconfig."""
    from kubernetes import client, config

    configuration = client.Configuration()
    use_in_cluster = in_cluster if in_cluster is not None else (
        kubeconfig is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    )
    try:
        if use_in_cluster:
            config.load_incluster_config(client_configuration=configuration)
        else:
            # Read $KUBECONFIG now: the client computes its default path once, at import.
            path = kubeconfig or os.environ.get("KUBECONFIG") or None
            config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        source = "in-cluster service account" if use_in_cluster else f"kubeconfig {kubeconfig or '(default)'}"
        raise BackendUnavailableError(f"could not load Kubernetes configuration from {source}: {exc}") from None
    # Reads are retried (bounded) by the backend itself; urllib3's own retries would multiply them.
    configuration.retries = 1
    for value in (configuration.api_key or {}).values():
        register_secret(str(value))
        register_secret(str(value).split(" ", 1)[-1])
    return client.ApiClient(configuration)


def tier_catalog_from_env(tiers_file: Optional[str], field: str, wanted: str) -> TierCatalog:
    """``tiers_file``, else Domino via ``$DOMINO_API_PROXY``, else ``$DDLSCALE_TIERS_FILE``.

    Raises :class:`InvalidInputError` naming ``field`` when none is configured.
    """
    if tiers_file:
        return FileTierCatalog(tiers_file)
    proxy = os.environ.get(API_PROXY_ENV)
    if proxy:
        from ...domino_auth import DominoAuth

        return DominoTierCatalog(proxy, auth=DominoAuth())
    if os.environ.get(TIERS_FILE_ENV):
        return FileTierCatalog(os.environ[TIERS_FILE_ENV])
    raise InvalidInputError(
        field,
        wanted,
        f"a hardware tier from a catalog; configure one with tier_catalog=, tiers_file=, "
        f"${API_PROXY_ENV} or ${TIERS_FILE_ENV}",
    )

"""Where the backend's API client and tier catalog come from.

In a pod (``$KUBERNETES_SERVICE_HOST`` set) the service account's in-cluster
config is used unless a kubeconfig is given; elsewhere the kubeconfig
(``kubeconfig`` path or ``$KUBECONFIG`` / ``~/.kube/config``) and ``context``.
"""
from typing import Any, Optional

from ..._core import settings
from ...errors import BackendUnavailableError, InvalidInputError
from ..._core.redaction import register_secret
from ..tiers import DominoTierCatalog, FileTierCatalog, TierCatalog

POOL_CONNECTIONS = 64
"""Connections the backend's API client keeps open for reuse (at least the connector's concurrent
readers, ``connector_calls.READERS``): the client's default, ``cpu_count x 5``, is 10 on two cores, and
a pool smaller than the threads using it closes every connection it cannot keep, so each later
request past it opens a new one (a TCP and TLS handshake)."""


def make_api_client(kubeconfig: Optional[str], context: Optional[str], in_cluster: Optional[bool]) -> Any:
    """A ``kubernetes.client.ApiClient`` from in-cluster config or a kubeconfig, keeping up to
    :data:`POOL_CONNECTIONS` connections for reuse."""
    from kubernetes import client, config

    configuration = client.Configuration()
    use_in_cluster = in_cluster if in_cluster is not None else (
        kubeconfig is None and settings.KUBERNETES_SERVICE_HOST.is_set()
    )
    try:
        if use_in_cluster:
            config.load_incluster_config(client_configuration=configuration)
        else:
            # Read $KUBECONFIG now: the client computes its default path once, at import.
            path = settings.KUBECONFIG.value(kubeconfig or None)
            config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        source = "in-cluster service account" if use_in_cluster else f"kubeconfig {kubeconfig or '(default)'}"
        raise BackendUnavailableError(f"could not load Kubernetes configuration from {source}: {exc}") from None
    configuration.retries = limited_retries()
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, POOL_CONNECTIONS)
    for value in (configuration.api_key or {}).values():
        register_secret(str(value))
        register_secret(str(value).split(" ", 1)[-1])
    return client.ApiClient(configuration)


def limited_retries() -> Any:
    """The urllib3 retry policy of the backend's API client: no reconnect, never a resend.

    The backend retries by itself: reads (bounded, or through an outage until
    the operation's deadline) and writes refused before anything was sent,
    logging an outage once (``KubeApi.outage``). urllib3's default would also
    resend a request whose answer timed out, with the full timeout each time,
    stretching a wait past its deadline, and would log every reconnect.
    """
    from urllib3.util.retry import Retry

    return Retry(total=1, connect=0, read=0, status=0, other=0)


def limit_retries(api_client: Any) -> None:
    """Give ``api_client``'s connection pools the :func:`limited_retries` policy, existing pools included."""
    retries = limited_retries()
    api_client.configuration.retries = retries
    manager = api_client.rest_client.pool_manager
    manager.connection_pool_kw["retries"] = retries
    for key in manager.pools.keys():
        pool = manager.pools.get(key)
        if pool is not None:
            pool.retries = retries


def tier_catalog_from_env(tiers_file: Optional[str], field: str, wanted: str) -> TierCatalog:
    """``tiers_file``, else Domino via ``$DOMINO_API_PROXY``, else ``$DDLSCALE_TIERS_FILE``.

    Raises :class:`InvalidInputError` naming ``field`` when none is configured.
    """
    if tiers_file:
        return FileTierCatalog(tiers_file)
    proxy = settings.DOMINO_API_PROXY.value()
    if proxy:
        from .._support.domino_auth import DominoAuth

        return DominoTierCatalog(proxy, auth=DominoAuth())
    from_env = settings.TIERS_FILE.value()
    if from_env:
        return FileTierCatalog(from_env)
    raise InvalidInputError(
        field,
        wanted,
        f"a hardware tier from a catalog; configure one with tier_catalog=, tiers_file=, "
        f"${settings.DOMINO_API_PROXY.name} or ${settings.TIERS_FILE.name}",
    )

"""Ending what a connector keeps between polls, for tests that each play a whole service life."""
import sys


def stop_connector_caches() -> None:
    """Close the backends the connector's polls kept open and stop the shared Kubernetes caches.

    A connector keeps both after its last poll (its caches for a minute, for a service's next polls): a
    test that leaves them hands the next test of its worker another server's informers, retrying a server
    that is gone. Only modules already imported are touched, so a test that never polled imports nothing."""
    connector = sys.modules.get("flytekitplugins_ddlscale.connector")
    if connector is not None:
        connector.POLL_BACKENDS.close()
    informers = sys.modules.get("flytekitplugins_ddlscale.backends.kubernetes._informer")
    if informers is None:
        return
    running = informers.running_informers(None)
    for informer in running:
        informer.stop()
    for informer in running:
        informer.join(10.0)
        assert not informer.alive, f"the {informer.resource.plural} informer did not stop within 10 s of being told"

"""Test servers that speak real protocols over HTTP on 127.0.0.1.

:mod:`tests.servers.scaler_server` stands in for Domino's cluster scaler
service (plus the API proxy's ``/access-token`` and Nucleus' tier and
principal routes). :mod:`tests.servers.ray_dashboard` and
:mod:`tests.servers.spark_master` serve the cluster heads' status JSON
(Ray State API node list, Spark master ``/json/``) with workers that join
when a test says (:mod:`tests.servers.status_http`). Reusable by
benchmarks and reliability tests.
"""

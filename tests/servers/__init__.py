"""Test servers that speak real protocols over HTTP on 127.0.0.1.

:mod:`tests.servers.scaler_server` stands in for Domino's cluster scaler
service (plus the API proxy's ``/access-token`` and Nucleus' tier and
principal routes). Reusable by benchmarks and reliability tests.
"""

"""Kubernetes backend: Domino distributed-compute clusters scaled through their CRDs.

Imports the ``kubernetes`` client only when a backend method first needs it.
"""
from ._backend import KubernetesBackend

__all__ = ["KubernetesBackend"]

"""Kubernetes backend: clusters scaled through their custom resources (``kubernetes`` imported on first use)."""
from ._backend import KubernetesBackend

__all__ = ["KubernetesBackend"]

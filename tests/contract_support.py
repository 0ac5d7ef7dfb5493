"""Helpers for the timeout-contract tests: run a printed remedy command as a user would (no tests here)."""
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

OUTER_ENV = ("DOMINO_API_PROXY", "DOMINO_TOKEN", "DOMINO_API_KEY", "DOMINO_RUN_ID", "DDLSCALE_BACKEND",
             "CLUSTER_SCALER_BASE_URL", "DOMINO_STARTING_USER_ID", "KUBECONFIG", "DDLSCALE_TIERS_FILE",
             "DDLSCALE_STATE_DIR", "KUBERNETES_SERVICE_HOST")
"""Settings that would point the command elsewhere: the command itself must carry what it needs."""


def run_shell(command: str, timeout: float = 120.0, **env: str) -> subprocess.CompletedProcess:
    """Run ``command`` exactly as printed, in bash, with this venv's ``ddlscale`` first on PATH.

    Only ``env`` is added to a clean environment (credentials a user would
    have exported, never part of a printed command).
    """
    environment = {k: v for k, v in os.environ.items() if k not in OUTER_ENV}
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment.get('PATH', '')}"
    environment.update(env)
    return subprocess.run(
        ["bash", "-c", command], env=environment, capture_output=True, text=True, timeout=timeout, check=False
    )


def write_kubeconfig(path: Path, server_url: str) -> Path:
    """A kubeconfig for the Kubernetes test server at ``server_url``."""
    config: Dict[str, object] = {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "k", "cluster": {"server": server_url}}],
        "users": [{"name": "u", "user": {"token": "test-token-1234"}}],
        "contexts": [{"name": "test", "context": {"cluster": "k", "user": "u"}}],
    }
    path.write_text(json.dumps(config))
    return path

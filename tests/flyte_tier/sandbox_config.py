"""FlytePropeller's configuration in the flyte tier: the sandbox's own files, one file of local addresses, the guide's.

The sandbox (``flytectl demo start``, Flyte v1.16.8) runs ``flyte start --config
/etc/flyte/config.d/*.yaml`` over the ConfigMap ``flyte-sandbox-config``
(``000-core.yaml`` ... ``100-inline-config.yaml``) and ``999-extra-config.yaml``,
the user's ``~/.flyte/sandbox/config.yaml``. :func:`files` gives the same
names: the sandbox's plugin settings (``001-plugins.yaml``) as the sandbox
ships them; ``500-local.yaml`` says only where things are here (the API
server, the S3 store, flyteadmin's event API, ports) and what is switched off
because it is not here (webhook, catalog, admin launcher); ``999-extra-config.yaml``
is the block docs/sandbox.md tells users to write (``sandbox-extra-config``),
with only its endpoint moved to the connector's local address.
"""
from typing import Dict, Mapping, Optional

import yaml

from tests.flyte_tier.guide import guide_yaml

PLUGINS = """\
tasks:
  task-plugins:
    default-for-task-types:
      container: container
      container_array: k8s-array
      sidecar: sidecar
    enabled-plugins:
    - container
    - sidecar
    - k8s-array
    - connector-service
    - echo
plugins:
  logs:
    kubernetes-enabled: true
    kubernetes-template-uri: http://localhost:30080/kubernetes-dashboard/#/log/{{.namespace }}/{{ .podName }}/pod?namespace={{ .namespace }}
    cloudwatch-enabled: false
    stackdriver-enabled: false
  k8s-array:
    logs:
      config:
        kubernetes-enabled: true
        kubernetes-template-uri: http://localhost:30080/kubernetes-dashboard/#/log/{{.namespace }}/{{ .podName }}/pod?namespace={{ .namespace }}
        cloudwatch-enabled: false
        stackdriver-enabled: false
"""
"""``001-plugins.yaml`` as the flyte-sandbox chart v1.16.8 renders it (less the co-pilot image, unused here)."""


def extra_config(connector: str) -> Dict[str, object]:
    """The guide's ``999-extra-config.yaml`` (docs/sandbox.md, ``sandbox-extra-config``), its endpoint set to
    ``connector``."""
    extra = guide_yaml("sandbox.md", "sandbox-extra-config")
    extra["plugins"]["connector-service"]["defaultConnector"]["endpoint"] = connector
    return extra


def files(*, kubeconfig: str, admin: str, s3_url: str, bucket: str, keys: Mapping[str, str], prof_port: int,
          connector: Optional[str]) -> Dict[str, str]:
    """The configuration folder's files, by name; ``connector`` None leaves out the guide's block."""
    local = {
        "admin": {"endpoint": admin, "insecure": True},
        "catalog-cache": {"type": "noop"},
        "event": {"type": "admin", "rate": 500, "capacity": 1000},
        "logger": {"show-source": True, "level": 4},
        "propeller": {
            "kube-config": str(kubeconfig), "create-flyteworkflow-crd": True,
            "rawoutput-prefix": f"s3://{bucket}/data", "enable-admin-launcher": False,
            "prof-port": prof_port, "workers": 4, "leader-election": {"enabled": False},
        },
        "storage": {
            "type": "stow", "container": bucket,
            "stow": {"kind": "s3", "config": {
                "region": "us-east-1", "disable_ssl": True, "v2_signing": True, "endpoint": s3_url,
                "auth_type": "accesskey", "access_key_id": keys["FLYTE_AWS_ACCESS_KEY_ID"],
                "secret_key": keys["FLYTE_AWS_SECRET_ACCESS_KEY"]}},
        },
        "plugins": {"k8s": {"default-env-vars": [{"FLYTE_AWS_ENDPOINT": s3_url}] + [{k: v} for k, v in keys.items()]}},
    }
    made = {"001-plugins.yaml": PLUGINS, "500-local.yaml": yaml.safe_dump(local, sort_keys=False)}
    if connector is not None:
        made["999-extra-config.yaml"] = yaml.safe_dump(extra_config(connector), sort_keys=False)
    return made

"""Compare the facts in :mod:`dco_crds` with CRD files, e.g. when the operator publishes new ones.

Usage (``DIR`` holds the operator's CustomResourceDefinition YAML files)::

    .venv/bin/python -m tests.servers.crd_compare DIR

Exit status 0 when every kind's names, scope, version, subresources and
schema agree with the facts, 1 with the differences listed otherwise.
Descriptions, ``default`` values and the list/map merge hints are not
compared: the test server does not act on them.
"""
import sys
from pathlib import Path
from typing import Any, List, Sequence

import yaml

from .dco_crds import CUSTOM_RESOURCES, SCHEMAS

IGNORED_KEYS = frozenset(
    {"description", "default", "x-kubernetes-map-type", "x-kubernetes-list-type", "x-kubernetes-list-map-keys"}
)


def _normalized(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {key: _normalized(value) for key, value in schema.items() if key not in IGNORED_KEYS}
        if "required" in out:
            out["required"] = sorted(out["required"])
        return out
    if isinstance(schema, list):
        return [_normalized(item) for item in schema]
    return schema


def _diff(ours: Any, theirs: Any, path: str, out: List[str]) -> None:
    if type(ours) is not type(theirs):
        out.append(f"{path}: facts have {ours!r:.60}, CRD has {theirs!r:.60}")
    elif isinstance(ours, dict):
        for key in sorted(set(ours) | set(theirs)):
            if key not in ours:
                out.append(f"{path}.{key}: only in the CRD")
            elif key not in theirs:
                out.append(f"{path}.{key}: only in the facts")
            else:
                _diff(ours[key], theirs[key], f"{path}.{key}", out)
    elif ours != theirs:
        out.append(f"{path}: facts have {ours!r:.60}, CRD has {theirs!r:.60}")


def differences(crd: dict) -> List[str]:
    """What the facts say differently from one CustomResourceDefinition (empty when they agree)."""
    names, spec = crd["spec"]["names"], crd["spec"]
    resource = CUSTOM_RESOURCES.get(names["plural"])
    if resource is None:
        return [f"{names['plural']}: not in the facts"]
    out: List[str] = []
    _diff(resource.kind, names["kind"], f"{resource.plural}: kind", out)
    _diff([resource.short_name], names.get("shortNames"), f"{resource.plural}: shortNames", out)
    _diff("Namespaced", spec["scope"], f"{resource.plural}: scope", out)
    _diff(["v1alpha1"], [version["name"] for version in spec["versions"]], f"{resource.plural}: versions", out)
    subresources = spec["versions"][0].get("subresources") or {}
    _diff(resource.status_subresource, "status" in subresources, f"{resource.plural}: status subresource", out)
    scale = resource.scale and {
        "specReplicasPath": resource.scale.spec_replicas_path,
        "statusReplicasPath": resource.scale.status_replicas_path,
        "labelSelectorPath": resource.scale.label_selector_path,
    }
    _diff(scale, subresources.get("scale"), f"{resource.plural}: scale subresource", out)
    theirs = _normalized(spec["versions"][0]["schema"]["openAPIV3Schema"])
    _diff(SCHEMAS[resource.plural], theirs, f"{resource.plural}: schema", out)
    return out


def main(argv: Sequence[str]) -> int:
    """Compare every ``*.yaml`` CRD in ``argv[0]``; print the differences; 0 when there are none."""
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python -m tests.servers.crd_compare DIR  (a directory of CRD YAML files)", file=sys.stderr)
        return 2
    files = sorted(Path(argv[0]).glob("*.yaml"))
    problems, seen = 0, set()
    for path in files:
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
            continue
        seen.add(crd["spec"]["names"]["plural"])
        for line in differences(crd):
            print(f"{path.name}: {line}")
            problems += 1
    for plural in sorted(set(CUSTOM_RESOURCES) - seen):
        print(f"{plural}: in the facts, but no CRD file for it")
        problems += 1
    print(f"{len(seen)} CRD(s) compared: " + (f"{problems} difference(s)" if problems else "the facts agree"))
    return 1 if problems else 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

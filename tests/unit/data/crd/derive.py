"""Derive a JSON schema for one version of a CustomResourceDefinition, as the API server's strict field validation
checks an object: the version's openAPIV3Schema whole, descriptions and status dropped, `x-kubernetes-int-or-string`
as integer-or-string, and every object with properties and without `x-kubernetes-preserve-unknown-fields` closed
(additionalProperties false). CEL rules (x-kubernetes-validations) are not evaluated; they are dropped.

    python3 tests/unit/data/crd/derive.py CRD.yaml VERSION SOURCE > tests/unit/data/crd/GROUP_KIND_VERSION.json

SOURCE is a sentence naming where CRD.yaml came from (repository, path, commit); it goes into the schema's $comment.
tests/unit/test_kubernetes.py reads the result; tests/unit/test_kubernetes_clouds.py checks each derived schema
rejects an unknown field."""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml

DROP = {"description", "x-kubernetes-validations", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type", "x-kubernetes-embedded-resource", "default", "format"}  # fmt: skip


def convert(node: Any) -> Any:
    if isinstance(node, list):
        return [convert(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: convert(value) for key, value in node.items() if key not in DROP}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out = {"anyOf": [{"type": "integer"}, {"type": "string"}], **out}
    preserve = out.pop("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in node and node.get("type") == "object" and not preserve:
        out.setdefault("additionalProperties", False)
    if "properties" in out:
        out["properties"] = {name: convert(value) for name, value in node["properties"].items()}
    return out


def derive(crd: dict[str, Any], version: str, source: str) -> dict[str, Any]:
    spec = crd["spec"]
    (entry,) = [v for v in spec["versions"] if v["name"] == version]
    schema = dict(entry["schema"]["openAPIV3Schema"])
    schema["properties"] = {k: v for k, v in schema["properties"].items() if k != "status"}
    schema["required"] = [r for r in schema.get("required", []) if r != "status"]
    if not schema["required"]:
        del schema["required"]
    derived = convert(schema)
    derived["properties"]["metadata"] = {"type": "object"}
    return {
        "$comment": f"Derived from {spec['names']['plural']}.{spec['group']} ({source}), version {version}, by "
        "tests/unit/data/crd/derive.py: the openAPIV3Schema whole, descriptions, defaults, formats and CEL rules "
        "dropped, every object with properties and without x-kubernetes-preserve-unknown-fields closed "
        "(additionalProperties false), as the API server's strict field validation rejects unknown fields.",
        "x-kubernetes-group-version-kind": [
            {"group": spec["group"], "version": version, "kind": spec["names"]["kind"]}
        ],
        **derived,
    }


if __name__ == "__main__":
    path, version, source = sys.argv[1:]
    with open(path) as crd_file:
        docs = [d for d in yaml.safe_load_all(crd_file) if d and d.get("kind") == "CustomResourceDefinition"]
    json.dump(derive(docs[0], version, source), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")

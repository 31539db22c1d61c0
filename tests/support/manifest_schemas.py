"""Strict schema checks for rendered manifests: core kinds and custom kinds alike.

Core kinds (and every object's ``metadata``) go to kubernetes-validate's strict schemas, which
refuse unknown fields. Custom kinds go to their own CRD's ``openAPIV3Schema`` for the version
their ``apiVersion`` names, from the CRDs vendored unchanged in ``tests/support/crds/``
(provenance in its README). An API server prunes fields a structural schema does not declare,
silently, so a misspelt field would apply and do nothing; here every object schema that lists
``properties`` refuses any other property unless it says ``x-kubernetes-preserve-unknown-fields``.
CEL rules (``x-kubernetes-validations``) are not evaluated.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

CRDS = Path(__file__).resolve().parent / "crds"

CORE_KUBERNETES_VERSIONS = ("1.35", "1.37")
"""Core kinds are checked against the oldest Kubernetes minor still supported upstream and the newest
kubernetes-validate knows: a field must exist in both to be used."""

PRESERVE_UNKNOWN = "x-kubernetes-preserve-unknown-fields"


@dataclass(frozen=True)
class CrdVersion:
    """One served version of one CRD file."""

    source: str
    """``<folder>/<file>`` under tests/support/crds, e.g. ``gateway-api-v1.6.1-standard/tcproutes.yaml``."""
    api_version: str
    kind: str
    schema: dict[str, Any]


COMBINATORS = frozenset({"allOf", "anyOf", "oneOf", "not"})
"""Their branches constrain a few properties of the object around them (Gateway's addresses list
``type`` and ``value`` in each ``oneOf`` branch), so they are left as written."""


def strict(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` wherever the API server would prune."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {name: strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = strict(value)
        else:
            out[key] = value  # keywords, x-kubernetes-* extensions, COMBINATORS as written
    if "properties" in out and "additionalProperties" not in out and not out.get(PRESERVE_UNKNOWN):
        out["additionalProperties"] = False
    return out


@functools.cache
def served_crd_versions() -> tuple[CrdVersion, ...]:
    found: list[CrdVersion] = []
    for path in sorted(CRDS.glob("*/*.yaml")):
        crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                found.append(CrdVersion(
                    source=str(path.relative_to(CRDS)), api_version=f"{group}/{version['name']}", kind=kind,
                    schema=strict(version["schema"]["openAPIV3Schema"]),
                ))
    return tuple(found)


def crds_serving(api_version: str, kind: str) -> list[CrdVersion]:
    """Every vendored CRD version that serves ``apiVersion``/``kind`` (empty for core kinds)."""
    return [v for v in served_crd_versions() if (v.api_version, v.kind) == (api_version, kind)]


def _schema_errors(obj: dict[str, Any], schema: dict[str, Any]) -> Iterator[str]:
    validator = jsonschema.Draft4Validator(schema)
    for error in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in error.absolute_path) or "(root)"
        yield f"{where}: {error.message}"


def _core_errors(obj: dict[str, Any]) -> Iterator[str]:
    for version in CORE_KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            yield f"no core schema and no vendored CRD for {obj['apiVersion']} {obj['kind']} (Kubernetes {version})"
        except kubernetes_validate.ValidationError as error:
            yield f"Kubernetes {version}: {str(error).splitlines()[0]}"


def problems(obj: dict[str, Any]) -> list[str]:
    """Why ``obj`` would not apply as written (empty when it validates strictly)."""
    return list(_problems_of(json.dumps(obj, sort_keys=True)))


@functools.cache
def _problems_of(canonical: str) -> tuple[str, ...]:
    """Memoised on the object's text: every component combination renders mostly the same objects."""
    obj = json.loads(canonical)
    name = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
    crds = crds_serving(obj["apiVersion"], obj["kind"])
    if not crds:
        return tuple(f"{name}: {p}" for p in _core_errors(obj))
    # A custom object's metadata is an ObjectMeta: checked as a core ConfigMap's would be.
    meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj.get("metadata", {})}
    found = [f"{name}: metadata: {p}" for p in _core_errors(meta)]
    for crd in crds:
        found.extend(f"{name} ({crd.source}): {p}" for p in _schema_errors(obj, crd.schema))
    return tuple(found)

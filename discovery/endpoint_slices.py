"""EndpointSlices -> TargetSnapshot: the routing table, derived purely from observed slices.

Both sources hand raw slices here, so a file routes exactly as the cluster does. The rules are the
Rust router's, which users rely on (docs/coming-from-rust.md). Endpoints that do not count are dropped
before the merge by pod (the most recently observed slice wins), so a not-ready copy never hides a
ready one. A malformed slice or endpoint is skipped, never fatal: one bad slice must not empty the
table; ``EndpointSliceError`` is for input that is not slices at all (bad YAML, a scalar where a slice goes).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from discovery.constants import SERVICE_NAME_LABEL
from discovery.settings import DiscoverySettings
from discovery.targets import Target, TargetSnapshot

SLICE_KIND = "EndpointSlice"
LIST_KINDS = ("EndpointSliceList", "List")
_MAX_PORT = 65_535


class EndpointSliceError(ValueError):
    """Input that is not an EndpointSlice (or a set of them) at all."""


def targets_from_slices(slices: Iterable[Mapping[str, Any]], settings: DiscoverySettings) -> TargetSnapshot:
    """The routable pods of ``slices`` (oldest first; a later slice's copy of a pod wins)."""
    by_pod: dict[str, Target] = {}
    for slice_ in slices:
        for target in _slice_targets(slice_, settings):
            by_pod[target.pod_name] = target
    return TargetSnapshot.of(list(by_pod.values()))


def slice_key(obj: Mapping[str, Any]) -> str:
    """The identity of a slice in a store: ``metadata.name``."""
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise EndpointSliceError("EndpointSlice has no metadata.name")
    return name


def parse_endpoints_document(text: str) -> list[dict[str, Any]]:
    """The EndpointSlices of a YAML (or JSON) text, in document order: one slice, a ``List`` or
    ``EndpointSliceList``, or a stream of either; documents of another ``kind`` and empty ones are skipped."""
    if not isinstance(text, str):
        raise EndpointSliceError(f"endpoints document must be text, got {type(text).__name__}")
    documents = _load_documents(text)
    slices: list[dict[str, Any]] = []
    for index, document in enumerate(documents):
        if document is None:
            continue
        if not isinstance(document, dict):
            raise EndpointSliceError(f"document {index}: expected a mapping, got {type(document).__name__}")
        kind = document.get("kind")
        if kind in LIST_KINDS or (kind is None and "items" in document):
            slices.extend(_list_items(document, index))
        elif kind is None or kind == SLICE_KIND:
            slices.append(_checked_object(document, f"document {index}"))
    return slices


def _load_documents(text: str) -> list[Any]:
    """JSON through ``json`` (``kubectl get -o json``: 100x faster than YAML on a 1 MiB list), else PyYAML's
    pure-Python SafeLoader: libyaml's C loader segfaults on deeply nested input (tests/fuzz)."""
    if text.lstrip()[:1] in ("{", "["):
        try:
            return [json.loads(text)]
        except (ValueError, RecursionError):
            pass  # YAML-only syntax, or broken: let the YAML loader say why
    try:
        return list(yaml.load_all(text, Loader=yaml.SafeLoader))
    except Exception as exc:  # PyYAML raises more than YAMLError (AttributeError on `!!timestamp x`)
        raise EndpointSliceError(f"endpoints document is not valid YAML: {_one_line(exc)}") from None


def _list_items(document: dict[Any, Any], index: int) -> list[dict[str, Any]]:
    items = document.get("items")
    if items is None:
        return []
    if not isinstance(items, list):
        raise EndpointSliceError(f"document {index}: items must be a list, got {type(items).__name__}")
    found: list[dict[str, Any]] = []
    for position, item in enumerate(items):
        where = f"document {index} item {position}"
        if not isinstance(item, dict):
            raise EndpointSliceError(f"{where}: expected a mapping, got {type(item).__name__}")
        if item.get("kind") in (None, SLICE_KIND):
            found.append(_checked_object(item, where))
    return found


def _checked_object(obj: dict[Any, Any], where: str) -> dict[str, Any]:
    if not all(isinstance(key, str) for key in obj):
        raise EndpointSliceError(f"{where}: field names must be strings")
    return obj


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _slice_targets(slice_: object, settings: DiscoverySettings) -> list[Target]:
    if not isinstance(slice_, Mapping) or not _selected(slice_, settings.service_name):
        return []
    ports = slice_.get("ports")
    grpc_port = _named_port(ports, settings.grpc_port_name, "TCP")
    quic_port = _named_port(ports, settings.quic_port_name, "UDP")
    endpoints = slice_.get("endpoints")
    if grpc_port is None or quic_port is None or not isinstance(endpoints, list | tuple):
        return []
    targets = []
    for endpoint in endpoints:
        pod_and_address = _routable_endpoint(endpoint)
        if pod_and_address is not None:
            targets.append(Target(pod_and_address[0], pod_and_address[1], grpc_port, quic_port))
    return targets


def _selected(slice_: Mapping[Any, Any], service_name: str) -> bool:
    metadata = slice_.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return isinstance(labels, Mapping) and labels.get(SERVICE_NAME_LABEL) == service_name


def _named_port(ports: object, name: str, protocol: str) -> int | None:
    """The first valid port called ``name`` with ``protocol`` (an absent protocol means TCP)."""
    if not isinstance(ports, list | tuple):
        return None
    for port in ports:
        if not isinstance(port, Mapping) or port.get("name") != name:
            continue
        port_protocol = port.get("protocol")
        if (port_protocol if port_protocol is not None else "TCP") != protocol:
            continue
        number = port.get("port")
        if type(number) is int and 1 <= number <= _MAX_PORT:  # bool is an int: excluded by type()
            return number
    return None


def _routable_endpoint(endpoint: object) -> tuple[str, str] | None:
    """(pod name, address) of an endpoint that may receive new flows, else None."""
    if not isinstance(endpoint, Mapping):
        return None
    conditions = endpoint.get("conditions")
    if conditions is None:
        conditions = {}
    if not isinstance(conditions, Mapping):
        return None
    ready, serving, terminating = (conditions.get(k) for k in ("ready", "serving", "terminating"))
    if not all(value is None or isinstance(value, bool) for value in (ready, serving, terminating)):
        return None
    if ready is False or serving is False or terminating is True:
        return None
    target_ref = endpoint.get("targetRef")
    if not isinstance(target_ref, Mapping) or target_ref.get("kind") not in (None, "Pod"):
        return None
    pod_name = target_ref.get("name")
    if not isinstance(pod_name, str) or not pod_name:
        return None
    addresses = endpoint.get("addresses")
    if not isinstance(addresses, list | tuple) or not addresses:
        return None
    address = addresses[0]
    if not isinstance(address, str) or not _is_ip_literal(address):
        return None
    return pod_name, address


def _is_ip_literal(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True

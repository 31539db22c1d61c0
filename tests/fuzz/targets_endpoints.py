"""Fuzz target of discovery's EndpointSlice documents (``parse_endpoints_document`` then
``targets_from_slices``), seeded with the demo's documents and a tree-level mutator."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import yaml

from discovery.constants import SERVICE_NAME_LABEL
from discovery.endpoint_slices import EndpointSliceError, parse_endpoints_document, targets_from_slices
from discovery.settings import DiscoverySettings
from router import constants as c
from router.demo.command import endpoint_slice, endpoints_document
from tests.fuzz.target import CORPUS_DIR, FuzzTarget, check

DISCOVERY = DiscoverySettings(
    "demo", c.DEFAULT_TARGET_SERVICE_NAME, c.DEFAULT_GRPC_PORT_NAME, c.DEFAULT_QUIC_PORT_NAME,
)
"""The discovery settings every document is read with (the demo's namespace)."""

def run_endpoints(data: bytes) -> str:
    slices = parse_endpoints_document(data.decode("utf-8", "replace"))
    snapshot = targets_from_slices(slices, DISCOVERY)
    for target in snapshot:
        check(isinstance(target.pod_name, str) and target.pod_name != "", "pod name")
        check(type(target.grpc_port) is int and 1 <= target.grpc_port <= 65535, "grpc port")
        check(type(target.quic_port) is int and 1 <= target.quic_port <= 65535, "quic port")
        check(isinstance(target.address, str), "address")
    return f"targets-{min(len(snapshot), 3)}"


def endpoints_seeds() -> list[bytes]:
    rows = [("stargate-0", "10.0.0.10", 50051, 50052), ("stargate-1", "fd00::11", 50051, 50052)]
    one = endpoint_slice(rows[:1])
    messy = json.loads(json.dumps(one))
    messy["endpoints"].append({"addresses": ["10.0.0.12"], "conditions": {"ready": False},
                               "targetRef": {"kind": "Pod", "name": "stargate-2"}})
    messy["endpoints"].append({"addresses": ["10.0.0.13"], "hostname": "stargate-3"})
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "stargate-headless"}}
    seeds = [
        endpoints_document(rows).encode(),
        json.dumps(one).encode(),
        yaml.safe_dump_all([service, one, messy]).encode(),
        yaml.safe_dump({"kind": "EndpointSliceList", "items": [one, messy]}).encode(),
        b"---\n...\n---\n" + yaml.safe_dump(one, default_flow_style=True).encode(),
    ]
    seeds += [path.read_bytes() for path in sorted(CORPUS_DIR.glob("endpoints*"))]
    return seeds


_VALUES: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 65535, 65536, 2**64, 1.5, "", "grpc", "quic", "TCP", "UDP", "Pod", "Service",
    "10.0.0.1", "::1", "fe80::1%eth0", "stargate-0", "stargate-headless", SERVICE_NAME_LABEL, [], {}, [{}],
    [[[]]], ["10.0.0.1", "10.0.0.2"], {"name": "grpc", "port": 1}, {"kind": None},
)
_KEYS = (
    "kind", "items", "metadata", "labels", "name", "ports", "port", "protocol", "endpoints", "addresses",
    "conditions", "ready", "serving", "terminating", "targetRef", "hostname", SERVICE_NAME_LABEL,
)


def _nodes(tree: Any, out: list[Any]) -> list[Any]:
    if isinstance(tree, dict | list):
        out.append(tree)
        for child in tree.values() if isinstance(tree, dict) else tree:
            _nodes(child, out)
    return out


def mutate_endpoints_tree(data: bytes, rng: random.Random) -> bytes | None:
    """Load, change nodes of the tree (value, key, type), dump as JSON or YAML; None if not YAML."""
    if len(data) > 8192:  # the pure-Python loader is slow on big parents: mutate those as bytes
        return None
    try:
        docs = [d for d in yaml.load_all(data.decode("utf-8", "replace"), Loader=yaml.SafeLoader)
                if d is not None]
    except Exception:
        return None
    containers = _nodes(docs, [])
    for _ in range(rng.randint(1, 4)):
        node = rng.choice(containers)
        value = rng.choice(_VALUES)
        value = copy.deepcopy(value)  # never share one object between places
        if isinstance(node, dict):
            key = rng.choice([*node.keys(), *_KEYS]) if node else rng.choice(_KEYS)
            if node and rng.random() < 0.2:
                node.pop(rng.choice(list(node.keys())), None)
            else:
                node[key] = value
        elif node:
            op = rng.random()
            if op < 0.3:
                node.append(copy.deepcopy(rng.choice(node)))
            elif op < 0.5:
                node.pop(rng.randrange(len(node)))
            else:
                node[rng.randrange(len(node))] = value
        else:
            node.append(value)
    try:
        if rng.random() < 0.5:
            text = json.dumps(docs[0] if len(docs) == 1 else {"kind": "List", "items": docs})
        else:
            text = yaml.safe_dump_all(docs, default_flow_style=rng.random() < 0.3)
    except (TypeError, ValueError, yaml.YAMLError):
        return None
    return text.encode()


YAML_DICTIONARY = (
    b"[", b"]", b"{", b"}", b": ", b"- ", b"\n", b"---\n", b"...\n", b"&a ", b"*a", b"!!binary ", b"!!timestamp ",
    b"!!python/object ", b"null", b"true", b"~", b"\"", b"'", b"1e309", b"0x1F", b".nan", b"<<: *a", b"? ",
    b"\t", b"#", b"%YAML 1.1\n", b"\\u0000", b"\xef\xbb\xbf", b"kind: List\n", b"items:\n",
)


ENDPOINTS_TARGETS = (
    FuzzTarget("endpoints", run_endpoints, (EndpointSliceError,), endpoints_seeds, 65_536, YAML_DICTIONARY,
               mutate_endpoints_tree),
)

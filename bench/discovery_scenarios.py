"""Discovery: snapshot rebuild for 5,000 endpoints in 50 slices, and the per-connection lookup.

No peer and no direct path: these are the router's own costs. The rebuild is what the
router pays on every EndpointSlice change (``targets_from_slices``, the pure function
both sources call); parsing is what the file source adds when the file changes; the
lookup is what every new connection or flow pays (``HostnameTemplate.pod_name_for`` then
``TargetSnapshot.get``).
"""

from __future__ import annotations

import json
import time
from typing import Any

from bench.context import BenchContext
from bench.procs import BenchError
from bench.results import Row, median
from discovery.constants import SERVICE_NAME_LABEL
from discovery.endpoint_slices import parse_endpoints_document, targets_from_slices
from discovery.settings import DiscoverySettings
from router.constants import (
    DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE,
    DEFAULT_GRPC_PORT_NAME,
    DEFAULT_QUIC_PORT_NAME,
    DEFAULT_TARGET_SERVICE_NAME,
)
from router.hostname import HostnameTemplate

NAMESPACE = "bench"
SLICES = 50
PER_SLICE = 100


def endpoint_slices(slices: int = SLICES, per_slice: int = PER_SLICE) -> list[dict[str, Any]]:
    """``slices`` EndpointSlices of ``per_slice`` ready pods each, as the API server lists them."""
    out = []
    for s in range(slices):
        endpoints = []
        for e in range(per_slice):
            i = s * per_slice + e
            endpoints.append({
                "addresses": [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": f"node-{i % 40}",
                "targetRef": {"kind": "Pod", "name": f"stargate-{i}", "namespace": NAMESPACE},
            })
        out.append({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": f"stargate-headless-{s:03d}", "namespace": NAMESPACE,
                         "labels": {SERVICE_NAME_LABEL: "stargate-headless"}},
            "addressType": "IPv4",
            "ports": [{"name": "grpc", "port": 50051, "protocol": "TCP"},
                      {"name": "quic", "port": 50052, "protocol": "UDP"}],
            "endpoints": endpoints,
        })
    return out


def _timed(fn: Any, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def discovery(ctx: BenchContext) -> list[Row]:
    settings = DiscoverySettings(
        NAMESPACE, DEFAULT_TARGET_SERVICE_NAME, DEFAULT_GRPC_PORT_NAME, DEFAULT_QUIC_PORT_NAME,
    )
    slices = endpoint_slices()
    total = SLICES * PER_SLICE
    snapshot = targets_from_slices(slices, settings)
    if len(snapshot) != total:
        raise BenchError(f"snapshot has {len(snapshot)} pods, expected {total}")
    reps = ctx.pick(5, 20)
    ctx.log(f"discovery: {total:,} endpoints in {SLICES} slices, {reps} rebuilds")
    rebuild = _timed(lambda: targets_from_slices(slices, settings), reps)
    document = json.dumps({"apiVersion": "v1", "kind": "List", "items": slices})
    parse = _timed(lambda: parse_endpoints_document(document), ctx.pick(3, 10))

    template = HostnameTemplate.parse(DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE, NAMESPACE)
    hostnames = [template.hostname_for(f"stargate-{i}") for i in range(0, total, 7)]
    hostnames += ["stargate-99999.stargate.external", "example.com"]
    lookups = ctx.pick(20, 100) * len(hostnames)
    pod_name_for, get = template.pod_name_for, snapshot.get

    def lookup_all() -> None:
        for _ in range(lookups // len(hostnames)):
            for h in hostnames:
                name = pod_name_for(h)
                if name is not None:
                    get(name)

    lookup = _timed(lookup_all, ctx.pick(3, 7))
    return [
        Row("discovery_rebuild", f"targets_from_slices: {total:,} endpoints in {SLICES} slices", "ms",
            _ms(median(rebuild)), higher_is_better=False),
        Row("discovery_parse", f"parse_endpoints_document: the same {len(document) >> 10:,} KiB JSON "
            "(file source)", "ms", _ms(median(parse)), higher_is_better=False),
        Row("route_lookup", "HostnameTemplate.pod_name_for + TargetSnapshot.get, 5,000-pod snapshot",
            "us/lookup", (median(lookup) or 0.0) / lookups * 1e6, higher_is_better=False),
    ]


def _ms(seconds: float | None) -> float | None:
    return seconds * 1000 if seconds is not None else None

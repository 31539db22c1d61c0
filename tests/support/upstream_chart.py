"""The upstream Helm chart's backend-router container, read from its rendered Deployment.

``data/upstream-chart-backend-router.yaml`` is a copy of what the upstream chart renders with
its defaults (the file's first lines say where it comes from): the tests run its command, args
and probes unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART_DEPLOYMENT = Path(__file__).resolve().parent / "data" / "upstream-chart-backend-router.yaml"


@dataclass(frozen=True)
class Probe:
    """An ``httpGet`` probe resolved to the container port it names."""

    path: str
    port: int


@dataclass(frozen=True)
class ChartContainer:
    """What the kubelet would run and ask: the command line, the probes, the ports, the limits."""

    command: list[str]
    args: list[str]
    readiness: Probe
    liveness: Probe
    ports: dict[str, tuple[int, str]]
    """Container port by name: ``(port, protocol)``."""
    security_context: dict[str, Any]
    memory_limit: str
    namespace: str


def chart_container() -> ChartContainer:
    deployment = yaml.safe_load(CHART_DEPLOYMENT.read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: (int(p["containerPort"]), p["protocol"]) for p in container["ports"]}

    def probe(kind: str) -> Probe:
        get = container[kind]["httpGet"]
        port = get["port"]
        return Probe(get["path"], ports[port][0] if isinstance(port, str) else int(port))

    return ChartContainer(
        command=list(container["command"]),
        args=list(container["args"]),
        readiness=probe("readinessProbe"),
        liveness=probe("livenessProbe"),
        ports=ports,
        security_context=dict(container["securityContext"]),
        memory_limit=container["resources"]["limits"]["memory"],
        namespace=deployment["metadata"]["namespace"],
    )


def chart_arg(args: list[str], flag: str) -> str:
    """The value of ``--flag=value`` in the chart's args (KeyError if the chart does not pass it)."""
    for arg in args:
        name, sep, value = arg.partition("=")
        if sep and name == flag:
            return value
    raise KeyError(flag)

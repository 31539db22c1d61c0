"""``stargate-router check``: print the routing table the router would serve, then exit.

Like ``haproxy -c`` / ``nginx -t`` before a rollout: the router's own flags and rules, then one read of
the targets (the endpoints file, or ONE LIST of EndpointSlices, never a watch). Any failure is one line
on stderr and exit 2; the whole API exchange is bounded by ``--connect-timeout-ms``, so ``check`` never hangs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

from discovery.constants import SERVICE_NAME_LABEL
from discovery.endpoint_slices import targets_from_slices
from discovery.settings import DiscoverySettings
from discovery.targets import Target, TargetSnapshot
from router.config import RouterConfig, build_parser, config_from_args
from router.flag_values import ConfigError
from router.hostname import HostnameTemplate, TemplateError

PROG = "stargate-router check"
EXIT_OK = 0
EXIT_ERROR = 2
"""Bad flags, file or API: the same status argparse and the router use for bad configuration."""


class CheckError(Exception):
    """Why the routing table could not be read; the message is the whole stderr line."""


def route_line(template: HostnameTemplate, target: Target) -> str:
    """``<hostname> -> <pod> grpc <address:port> quic <address:port>`` (``-`` for a missing port)."""
    grpc = target.grpc_endpoint if target.grpc_port else "-"
    quic = target.quic_endpoint if target.quic_port else "-"
    return f"{template.hostname_for(target.pod_name)} -> {target.pod_name} grpc {grpc} quic {quic}"


def _settings(config: RouterConfig) -> DiscoverySettings:
    return DiscoverySettings(
        namespace=config.target_namespace,
        service_name=config.target_service_name,
        grpc_port_name=config.grpc_port_name,
        quic_port_name=config.quic_port_name,
    )


def _from_file(config: RouterConfig) -> tuple[TargetSnapshot, str]:
    from discovery.file_source import load_endpoints_file

    assert config.endpoints_file is not None
    load = load_endpoints_file(config.endpoints_file, _settings(config))
    if load.snapshot is None:
        raise CheckError(f"--endpoints-file {config.endpoints_file}: {load.error}")
    return load.snapshot, f"file {config.endpoints_file}"


async def _api_client(config: RouterConfig) -> Any:
    """An ApiClient resolved as the router's discovery does (--kubeconfig, in-cluster, ``KUBECONFIG``)."""
    from kubernetes_asyncio import client

    from discovery.kube_config import config_source, default_kubeconfig_missing, load_configuration

    where = config_source(config.kubeconfig)
    if default_kubeconfig_missing(config.kubeconfig):
        raise CheckError(f"{where}: not found; pass --kubeconfig, or --endpoints-file")
    try:
        cfg = await load_configuration(config.kubeconfig)
    except Exception as exc:  # missing/invalid kubeconfig, no service-account files, exec plugin errors
        raise CheckError(f"{where}: {_one_line(exc)}") from None
    return client.ApiClient(cfg)


async def _list_slices(api_client: Any, config: RouterConfig) -> list[dict[str, Any]]:
    """ONE LIST of the Service's EndpointSlices with the router's selector, never a watch."""
    from kubernetes_asyncio import client

    from discovery.kubernetes_source import parse_slice_list

    api: Any = client.DiscoveryV1Api(api_client)  # _preload_content=False: a raw aiohttp response
    response = await api.list_namespaced_endpoint_slice(
        config.target_namespace,
        label_selector=f"{SERVICE_NAME_LABEL}={config.target_service_name}",
        _preload_content=False,
    )
    try:
        body = await response.read()
    finally:
        response.release()
    if response.status != 200:
        raise CheckError(f"HTTP {response.status}: {_status_message(body)}")
    slices, _resource_version = parse_slice_list(body)
    return slices


async def _from_kubernetes(config: RouterConfig) -> tuple[TargetSnapshot, str]:
    """Client config and LIST within --connect-timeout-ms (a blackholed API server or a stuck exec plugin)."""
    import aiohttp

    from discovery.kubernetes_source import KubeApiResponseError

    budget = f"no answer within --connect-timeout-ms {round(config.connect_timeout_s * 1000)}"
    deadline = asyncio.get_running_loop().time() + config.connect_timeout_s
    try:
        async with asyncio.timeout_at(deadline):
            api_client = await _api_client(config)
    except TimeoutError:
        raise CheckError(f"Kubernetes client config: {budget}") from None
    server = f"Kubernetes API {api_client.configuration.host}"
    try:
        async with asyncio.timeout_at(deadline):
            slices = await _list_slices(api_client, config)
    except TimeoutError:  # aiohttp's own timeouts are TimeoutErrors too
        raise CheckError(f"{server}: {budget}") from None
    except CheckError as exc:
        raise CheckError(f"{server}: {exc}") from None
    except (aiohttp.ClientError, OSError, KubeApiResponseError) as exc:
        raise CheckError(f"{server}: {_one_line(exc)}") from None
    finally:
        await api_client.close()
    where = f"kubernetes {config.target_namespace}/{config.target_service_name}"
    return targets_from_slices(slices, _settings(config)), where


def _status_message(body: bytes) -> str:
    """A Kubernetes Status body's ``message``, else the start of whatever came instead."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return " ".join(body[:200].decode("utf-8", "replace").split()) or "(empty body)"
    message = data.get("message") if isinstance(data, dict) else None
    return _one_line(message if message is not None else data)


def _one_line(value: object) -> str:
    text = " ".join(str(value).split())[:300]
    return text or type(value).__name__


def check(config: RouterConfig) -> tuple[list[str], str]:
    """The table's lines (sorted by pod) and the summary line; raises CheckError or ConfigError."""
    try:
        template = HostnameTemplate.parse(config.advertised_hostname_template, config.target_namespace)
    except TemplateError as exc:  # the router's own message for this flag (router.app)
        raise ConfigError(f"--advertised-hostname-template: {exc}") from None
    if config.endpoints_file is not None:
        snapshot, where = _from_file(config)
    else:
        snapshot, where = asyncio.run(_from_kubernetes(config))
    lines = [route_line(template, target) for target in snapshot]  # a snapshot iterates by pod
    noun = "target" if len(snapshot) == 1 else "targets"
    return lines, f"{len(snapshot)} ready {noun} from {where}"


def run_check(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """``stargate-router check [router flags]``: print the table and a summary; 0 or 2."""
    build_parser(parser)
    parser.exit_on_error = False  # a bad flag is one line, not argparse's usage block
    logging.getLogger("kubernetes_asyncio").setLevel(logging.CRITICAL)  # its errors reach us raised
    try:
        _known, unknown = parser.parse_known_args(argv)  # answers --help
        if unknown:
            raise ConfigError(f"unrecognized arguments: {' '.join(unknown)}")
        config = config_from_args(argv)
        lines, summary = check(config)
    except (argparse.ArgumentError, ConfigError, CheckError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    for line in lines:
        print(line)
    print(summary)
    for warning in (config.inert.warning(), config.proxy_trust_warning()):  # the router's start says them too
        if warning is not None:
            print(f"{PROG}: warning: {warning}", file=sys.stderr)
    if not lines:
        print(f"{PROG}: warning: no ready targets: the router would start not ready (/readyz 503)",
              file=sys.stderr)
    return EXIT_OK

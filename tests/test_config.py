"""CLI contract: the Rust router's flags and defaults; bad values exit 2 with one line naming the flag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from router import constants as c
from router.config import ConfigError, config_from_args, parse_socket_address


def test_defaults_match_the_rust_router() -> None:
    cfg = config_from_args([], environ={"POD_NAMESPACE": "nvcf"})
    assert str(cfg.listen_addr) == c.DEFAULT_LISTEN_ADDR == "0.0.0.0:50071"
    assert str(cfg.reverse_tunnel_listen_addr) == c.DEFAULT_REVERSE_TUNNEL_LISTEN_ADDR == "0.0.0.0:50072"
    assert str(cfg.health_listen_addr) == c.DEFAULT_HEALTH_LISTEN_ADDR == "0.0.0.0:8080"
    assert cfg.target_namespace == "nvcf"
    assert cfg.target_service_name == "stargate-headless"
    assert cfg.advertised_hostname_template == "{pod_name}.stargate.external"
    assert (cfg.grpc_port_name, cfg.quic_port_name) == ("grpc", "quic")
    assert cfg.connect_timeout_s == 5.0
    assert cfg.relay_idle_timeout_s == 300.0
    assert cfg.peek_timeout_s == 5.0
    assert cfg.round_robin_paths == frozenset({"/stargate.StargateControlPlane/WatchStargates"})
    assert cfg.endpoints_file is None
    assert cfg.log_level == "info"


def test_trust_at_the_edge_is_off_and_unlimited_by_default() -> None:
    cfg = config_from_args([], environ={"POD_NAMESPACE": "x"})
    assert cfg.accept_proxy_protocol is c.DEFAULT_ACCEPT_PROXY_PROTOCOL is False
    assert cfg.proxy_protocol_trusted_cidrs == ()  # () = every source, from the default 0.0.0.0/0,::/0
    assert cfg.max_connections_per_client == c.DEFAULT_MAX_CONNECTIONS_PER_CLIENT == 0
    assert cfg.max_quic_flows_per_client == c.DEFAULT_MAX_QUIC_FLOWS_PER_CLIENT == 0


@pytest.mark.parametrize(("args", "on"), [(["--accept-proxy-protocol"], True),
                                          (["--accept-proxy-protocol=true"], True),
                                          (["--accept-proxy-protocol", "false"], False)])
def test_accept_proxy_protocol_is_a_flag_or_a_boolean(args: list[str], on: bool) -> None:
    assert config_from_args(args, environ={"POD_NAMESPACE": "x"}).accept_proxy_protocol is on


def test_trusted_cidrs_and_limits_are_parsed() -> None:
    cfg = config_from_args(
        ["--accept-proxy-protocol", "--proxy-protocol-trusted-cidrs", "10.0.0.0/8, 127.0.0.9,fd00::/8",
         "--max-connections-per-client", "50", "--max-quic-flows-per-client", "20"],
        environ={"POD_NAMESPACE": "x"},
    )
    assert [str(n) for n in cfg.proxy_protocol_trusted_cidrs] == ["10.0.0.0/8", "127.0.0.9/32", "fd00::/8"]
    assert (cfg.max_connections_per_client, cfg.max_quic_flows_per_client) == (50, 20)


def test_access_log_is_on_and_debug_endpoints_off_by_default() -> None:
    cfg = config_from_args([], environ={"POD_NAMESPACE": "x"})
    assert (cfg.access_log, cfg.debug_endpoints) == (True, False)
    cfg = config_from_args(["--access-log", "off", "--debug-endpoints"], environ={"POD_NAMESPACE": "x"})
    assert (cfg.access_log, cfg.debug_endpoints) == (False, True)


def test_tcp_accept_is_deferred_by_default() -> None:
    assert config_from_args([], environ={"POD_NAMESPACE": "x"}).tcp_defer_accept is True
    cfg = config_from_args(["--tcp-defer-accept", "off"], environ={"POD_NAMESPACE": "x"})
    assert cfg.tcp_defer_accept is False


def test_flag_overrides_environment_namespace() -> None:
    cfg = config_from_args(["--target-namespace", "a"], environ={"POD_NAMESPACE": "b"})
    assert cfg.target_namespace == "a"


def test_log_level_from_environment() -> None:
    assert config_from_args([], environ={"POD_NAMESPACE": "x", "LOG_LEVEL": "DEBUG"}).log_level == "debug"


@pytest.mark.parametrize(("given", "level"), [("warn", "warn"), ("TRACE", "trace"), ("info,kube=warn", "info")])
def test_rust_router_log_levels_are_accepted(given: str, level: str) -> None:
    assert config_from_args(["--log-level", given], environ={"POD_NAMESPACE": "x"}).log_level == level


def test_ipv6_listen_address() -> None:
    assert parse_socket_address("--listen-addr", "[::]:50071").host == "::"


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--listen-addr", "nonsense"], "--listen-addr"),
        (["--listen-addr", "0.0.0.0:99999"], "--listen-addr"),
        (["--health-listen-addr", "example.com:80"], "--health-listen-addr"),
        (["--reverse-tunnel-listen-addr", "1.2.3.4:x"], "--reverse-tunnel-listen-addr"),
        (["--advertised-hostname-template", "stargate.external"], "--advertised-hostname-template"),
        (["--advertised-hostname-template", "{pod_name}.{cluster}.x"], "--advertised-hostname-template"),
        (["--connect-timeout-ms", "0"], "--connect-timeout-ms"),
        (["--relay-idle-timeout-ms", "-5"], "--relay-idle-timeout-ms"),
        (["--peek-timeout-ms", "soon"], "--peek-timeout-ms"),
        (["--endpoints-file", "/nonexistent/endpoints.yaml"], "--endpoints-file"),
        (["--log-format", "xml"], "--log-format"),
        (["--log-level", "loud"], "--log-level"),
        (["--workers", "0"], "--workers"),
        (["--round-robin-paths", "relative/path"], "--round-robin-paths"),
        (["--quic-cid-length", "21"], "--quic-cid-length"),
        (["--accept-proxy-protocol=maybe"], "--accept-proxy-protocol"),
        (["--proxy-protocol-trusted-cidrs", "10.0.0.0/33"], "--proxy-protocol-trusted-cidrs"),
        (["--proxy-protocol-trusted-cidrs", "10.0.0.1/8"], "--proxy-protocol-trusted-cidrs"),
        (["--proxy-protocol-trusted-cidrs", "gateway.local"], "--proxy-protocol-trusted-cidrs"),
        (["--proxy-protocol-trusted-cidrs", " , "], "--proxy-protocol-trusted-cidrs"),
        (["--max-connections-per-client", "-1"], "--max-connections-per-client"),
        (["--max-connections-per-client", "ten"], "--max-connections-per-client"),
        (["--max-quic-flows-per-client", "1000001"], "--max-quic-flows-per-client"),
        (["--max-quic-flows-per-client", "1.5"], "--max-quic-flows-per-client"),
        (["--access-log", "yes"], "--access-log"),
        (["--tcp-defer-accept", "1"], "--tcp-defer-accept"),
    ],
)
def test_bad_value_names_its_flag(args: list[str], flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_args(args, environ={"POD_NAMESPACE": "x"})
    assert str(err.value).startswith(flag)
    assert "\n" not in str(err.value)


def test_namespace_is_required() -> None:
    with pytest.raises(ConfigError, match=r"^--target-namespace"):
        config_from_args([], environ={})


def test_process_exits_2_with_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "router", "--connect-timeout-ms", "0"],
        capture_output=True, text=True, timeout=30, env={"POD_NAMESPACE": "x", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "--connect-timeout-ms" in lines[0]


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--proxy-protocol-trusted-cidrs", "10.0.0.0/99"), ("--max-quic-flows-per-client", "-3"),
     ("--accept-proxy-protocol", "perhaps")],
)
def test_bad_trust_flag_exits_2_with_one_line_naming_it(flag: str, value: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "router", f"{flag}={value}"],
        capture_output=True, text=True, timeout=30, env={"POD_NAMESPACE": "x", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0]


def test_unknown_flag_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "router", "--no-such-flag"],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 2


def test_kube_watch_idle_timeout_defaults_to_three_bookmark_periods_and_is_validated() -> None:
    env = {"POD_NAMESPACE": "x"}
    assert config_from_args([], environ=env).kube_watch_idle_timeout_s == 180.0
    assert config_from_args(["--kube-watch-idle-timeout-ms", "1500"], environ=env).kube_watch_idle_timeout_s == 1.5
    for bad in ("0", "-5", "soon", str(c.MIN_KUBE_WATCH_IDLE_TIMEOUT_MS - 1)):
        with pytest.raises(ConfigError, match=r"^--kube-watch-idle-timeout-ms: "):
            config_from_args(["--kube-watch-idle-timeout-ms", bad], environ=env)

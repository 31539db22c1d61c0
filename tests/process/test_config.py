"""CLI contract: the Rust router's flags and defaults; bad values exit 2 with one line naming the flag."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from router import constants as c
from router.config import build_parser, config_from_args
from router.flag_values import ConfigError, parse_socket_address
from router.inert_flags import InertFlags
from tests.support.upstream_chart import chart_container


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
    assert cfg.proxy_protocol_trusted_cidrs == c.DEFAULT_PROXY_PROTOCOL_TRUSTED_CIDRS == ()  # no source trusted
    assert cfg.proxy_trust_warning() is None
    assert cfg.max_connections_per_client == c.DEFAULT_MAX_CONNECTIONS_PER_CLIENT == 0
    assert cfg.max_quic_flows_per_client == c.DEFAULT_MAX_QUIC_FLOWS_PER_CLIENT == 0


LOOPBACK_BALANCER = "--proxy-protocol-trusted-cidrs=127.0.0.9/32"


@pytest.mark.parametrize(("args", "on"), [(["--accept-proxy-protocol", LOOPBACK_BALANCER], True),
                                          (["--accept-proxy-protocol=true", LOOPBACK_BALANCER], True),
                                          (["--accept-proxy-protocol", "true", LOOPBACK_BALANCER], True),
                                          (["--accept-proxy-protocol", "false"], False)])
def test_accept_proxy_protocol_is_a_flag_or_a_boolean(args: list[str], on: bool) -> None:
    assert config_from_args(args, environ={"POD_NAMESPACE": "x"}).accept_proxy_protocol is on


@pytest.mark.parametrize(
    "args",
    [["--accept-proxy-protocol"], ["--accept-proxy-protocol=true"], ["--accept-proxy-protocol", "true"]],
    ids=["bare", "equals", "separate"],
)
def test_proxy_on_without_trusted_cidrs_is_one_line_naming_the_flag(args: list[str]) -> None:
    """nginx's ``set_real_ip_from``: no source is believed until named (issue 41, finding 8)."""
    with pytest.raises(ConfigError) as err:
        config_from_args(args, environ={"POD_NAMESPACE": "x"})
    assert str(err.value) == (
        "--proxy-protocol-trusted-cidrs: required with --accept-proxy-protocol "
        "(the balancer's addresses; no source is trusted by default)"
    )


def test_trusted_cidrs_without_proxy_are_parsed_and_unused() -> None:
    cfg = config_from_args([LOOPBACK_BALANCER], environ={"POD_NAMESPACE": "x"})
    assert not cfg.accept_proxy_protocol and [str(n) for n in cfg.proxy_protocol_trusted_cidrs] == ["127.0.0.9/32"]


@pytest.mark.parametrize(
    ("cidrs", "warning"),
    [("0.0.0.0/0,::/0", "trusts every source"), ("0.0.0.0/0", "trusts every IPv4 source"),
     ("10.0.0.0/8,::/0", "trusts every IPv6 source"), ("10.0.0.0/8,fd00::/8", None)],
)
def test_an_explicit_every_source_is_kept_and_warned_about(cidrs: str, warning: str | None) -> None:
    cfg = config_from_args(["--accept-proxy-protocol", f"--proxy-protocol-trusted-cidrs={cidrs}"],
                           environ={"POD_NAMESPACE": "x"})
    assert ",".join(str(n) for n in cfg.proxy_protocol_trusted_cidrs) == cidrs
    said = cfg.proxy_trust_warning()
    if warning is None:
        assert said is None
    else:
        assert said is not None and said.startswith(f"--proxy-protocol-trusted-cidrs {warning}: ")


def test_trusted_cidrs_and_limits_are_parsed() -> None:
    cfg = config_from_args(
        ["--accept-proxy-protocol", "--proxy-protocol-trusted-cidrs", "10.0.0.0/8, 127.0.0.9,fd00::/8",
         "--max-connections-per-client", "50", "--max-quic-flows-per-client", "20"],
        environ={"POD_NAMESPACE": "x"},
    )
    assert [str(n) for n in cfg.proxy_protocol_trusted_cidrs] == ["10.0.0.0/8", "127.0.0.9/32", "fd00::/8"]
    assert (cfg.max_connections_per_client, cfg.max_quic_flows_per_client) == (50, 20)


def test_quic_lb_is_off_by_default_and_takes_a_server_id_of_1_to_15_bytes() -> None:
    assert config_from_args([], environ={"POD_NAMESPACE": "x"}).quic_lb_server_id_bytes == 0
    for given in ("1", "4", "15"):
        cfg = config_from_args([f"--quic-lb-server-id-bytes={given}"], environ={"POD_NAMESPACE": "x"})
        assert cfg.quic_lb_server_id_bytes == int(given)


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
        (["--quic-lb-server-id-bytes", "16"], "--quic-lb-server-id-bytes"),
        (["--quic-lb-server-id-bytes", "-1"], "--quic-lb-server-id-bytes"),
        (["--quic-lb-server-id-bytes=four"], "--quic-lb-server-id-bytes"),
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
        (["--tunnel-protocol", "quic"], "--tunnel-protocol"),
        (["--tunnel-protocol=WebTransport"], "--tunnel-protocol"),
        (["--relay-keep-alive-ms", "-1"], "--relay-keep-alive-ms"),
        (["--relay-keep-alive-ms=soon"], "--relay-keep-alive-ms"),
        (["--quic-insecure=maybe"], "--quic-insecure"),
        (["--upstream-tls-cert-path", "/ca.pem"], "--upstream-tls-cert-path"),
        (["--tunnel-protocol=raw-quic", "--upstream-tls-cert-path=/ca.pem"], "--upstream-tls-cert-path"),
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
     ("--accept-proxy-protocol", "perhaps"), ("--tunnel-protocol", "quic"), ("--relay-keep-alive-ms", "soon"),
     ("--quic-insecure", "perhaps"), ("--upstream-tls-cert-path", "/etc/ca.pem")],
)
def test_a_bad_trust_or_rust_router_flag_exits_2_with_one_line_naming_it(flag: str, value: str) -> None:
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


# -- The Rust router's flags, in the forms clap accepts --------------------------------------
X = {"POD_NAMESPACE": "x"}

RUST_VALUE_FLAGS = (
    ("--listen-addr", "127.0.0.1:1", lambda cfg: str(cfg.listen_addr)),
    ("--reverse-tunnel-listen-addr", "127.0.0.1:2", lambda cfg: str(cfg.reverse_tunnel_listen_addr)),
    ("--health-listen-addr", "127.0.0.1:3", lambda cfg: str(cfg.health_listen_addr)),
    ("--target-namespace", "nvcf", lambda cfg: cfg.target_namespace),
    ("--target-service-name", "llm-request-router", lambda cfg: cfg.target_service_name),
    ("--advertised-hostname-template", "{pod_name}.h.nvcf.svc", lambda cfg: cfg.advertised_hostname_template),
    ("--grpc-port-name", "g", lambda cfg: cfg.grpc_port_name),
    ("--quic-port-name", "q", lambda cfg: cfg.quic_port_name),
    ("--connect-timeout-ms", "1500", lambda cfg: str(int(cfg.connect_timeout_s * 1000))),
    ("--relay-idle-timeout-ms", "2500", lambda cfg: str(int(cfg.relay_idle_timeout_s * 1000))),
    ("--relay-keep-alive-ms", "0", lambda cfg: str(cfg.inert.relay_keep_alive_ms)),
    ("--tls-cert-path", "/etc/tls.crt", lambda cfg: cfg.inert.tls_cert_path),
    ("--tls-key-path", "/etc/tls.key", lambda cfg: cfg.inert.tls_key_path),
    ("--tunnel-protocol", "webtransport", lambda cfg: cfg.tunnel_protocol),
)
"""Every valued flag of the Rust router, the value given and how to read it back from the config."""


@pytest.mark.parametrize(("flag", "value", "read"), RUST_VALUE_FLAGS, ids=[f[0] for f in RUST_VALUE_FLAGS])
@pytest.mark.parametrize("form", ["equals", "separate"])
def test_every_rust_router_flag_parses_as_flag_equals_value_and_flag_space_value(
    flag: str, value: str, read: object, form: str
) -> None:
    args = [f"{flag}={value}"] if form == "equals" else [flag, value]
    assert read(config_from_args(args, environ=X)) == value  # type: ignore[operator]


@pytest.mark.parametrize(
    ("env", "read"),
    [
        ({c.TARGET_NAMESPACE_ENV: "nvcf"}, lambda cfg: cfg.target_namespace == "nvcf"),
        ({c.TLS_CERT_PATH_ENV: "/etc/tls.crt"}, lambda cfg: cfg.inert.tls_cert_path == "/etc/tls.crt"),
        ({c.TLS_KEY_PATH_ENV: "/etc/tls.key"}, lambda cfg: cfg.inert.tls_key_path == "/etc/tls.key"),
        ({c.QUIC_INSECURE_ENV: "true"}, lambda cfg: cfg.inert.quic_insecure is True),
        ({c.UPSTREAM_TLS_CERT_PATH_ENV: "/ca.pem"}, lambda cfg: cfg.inert.upstream_tls_cert_path == "/ca.pem"),
    ],
    ids=["POD_NAMESPACE", "TLS_CERT", "TLS_KEY", "QUIC_INSECURE", "UPSTREAM_TLS_CERT"],
)
def test_every_rust_router_environment_variable_sets_its_flag(env: dict[str, str], read: object) -> None:
    args = ["--tunnel-protocol", "webtransport"]
    assert read(config_from_args(args, environ={**X, **env}))  # type: ignore[operator]


@pytest.mark.parametrize(
    ("args", "env", "on"),
    [
        ([], {}, False),
        (["--quic-insecure"], {}, True),
        (["--quic-insecure=true"], {}, True),
        (["--quic-insecure=false"], {}, False),
        ([], {c.QUIC_INSECURE_ENV: "1"}, True),
        ([], {c.QUIC_INSECURE_ENV: "0"}, False),
        ([], {c.QUIC_INSECURE_ENV: "false"}, False),
        (["--quic-insecure=false"], {c.QUIC_INSECURE_ENV: "true"}, False),
    ],
)
def test_quic_insecure_is_a_bare_flag_a_boolean_or_its_environment_variable(
    args: list[str], env: dict[str, str], on: bool
) -> None:
    assert config_from_args(args, environ={**X, **env}).inert.quic_insecure is on


def test_a_bad_quic_insecure_environment_value_names_the_flag_and_the_variable() -> None:
    with pytest.raises(ConfigError, match=rf"^--quic-insecure \(env {c.QUIC_INSECURE_ENV}\): "):
        config_from_args([], environ={**X, c.QUIC_INSECURE_ENV: "maybe"})


def test_the_flag_wins_over_its_environment_variable() -> None:
    cfg = config_from_args(["--tls-cert-path", "/flag.crt"], environ={**X, c.TLS_CERT_PATH_ENV: "/env.crt"})
    assert cfg.inert.tls_cert_path == "/flag.crt"


def test_rust_router_tunnel_and_keep_alive_defaults() -> None:
    cfg = config_from_args([], environ=X)
    assert cfg.tunnel_protocol == c.DEFAULT_TUNNEL_PROTOCOL == "raw-quic" and not cfg.webtransport
    assert cfg.inert == InertFlags() and cfg.inert.relay_keep_alive_ms == c.DEFAULT_RELAY_KEEP_ALIVE_MS == 10_000
    assert cfg.inert.warning() is None


def test_upstream_tls_cert_path_is_accepted_only_for_webtransport_tunnels() -> None:
    cfg = config_from_args(["--tunnel-protocol", "webtransport", "--upstream-tls-cert-path", "/ca.pem"], environ=X)
    assert cfg.webtransport and cfg.inert.upstream_tls_cert_path == "/ca.pem"
    with pytest.raises(ConfigError, match=r"^--upstream-tls-cert-path: requires --tunnel-protocol webtransport"):
        config_from_args([], environ={**X, c.UPSTREAM_TLS_CERT_PATH_ENV: "/ca.pem"})


def test_the_upstream_charts_args_parse_unchanged_and_name_the_flags_without_effect() -> None:
    chart = chart_container()
    cfg = config_from_args(chart.args, environ={})
    assert (cfg.target_namespace, cfg.target_service_name) == ("nvcf", "llm-request-router")
    assert cfg.advertised_hostname_template == "{pod_name}.llm-request-router-headless.nvcf.svc.cluster.local"
    assert cfg.tunnel_protocol == "raw-quic"
    assert cfg.inert.given() == ("--tls-cert-path", "--tls-key-path", "--quic-insecure")
    warning = cfg.inert.warning()
    assert warning is not None and "\n" not in warning
    assert "--tls-cert-path, --tls-key-path, --quic-insecure (the router holds no certificate" in warning


def test_the_warning_names_every_flag_without_effect_and_why() -> None:
    cfg = config_from_args(
        ["--tunnel-protocol=webtransport", "--tls-cert-path=/c", "--tls-key-path=/k", "--quic-insecure",
         "--upstream-tls-cert-path=/ca", "--relay-keep-alive-ms=20000"],
        environ=X,
    )
    warning = cfg.inert.warning()
    assert warning is not None
    for flag in ("--tls-cert-path", "--tls-key-path", "--quic-insecure", "--upstream-tls-cert-path",
                 "--relay-keep-alive-ms=20000"):
        assert flag in warning, flag
    assert "TLS and QUIC end at the pod" in warning and "cannot send PINGs inside encrypted QUIC" in warning
    # The default keep-alive, given explicitly, is what the Rust router does anyway: not named.
    assert config_from_args(["--relay-keep-alive-ms=10000"], environ=X).inert.warning() is None


def test_the_readme_flags_table_lists_every_flag() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.partition("\n## Flags\n")[2].partition("\n## ")[0]
    listed = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `--")}
    flags = {o for action in build_parser()._actions for o in action.option_strings if o.startswith("--")}
    assert flags - {"--help"} <= listed, sorted(flags - listed)

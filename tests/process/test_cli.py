"""``stargate-router`` as a user meets it: the installed console script, run as a subprocess.

PYTHONPATH puts this tree first, so the script runs this tree's ``router.cli``.
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from router import constants as c
from router.cli import SUBCOMMANDS
from router.demo.grpc_pods import RunningPod, call_whoami, start_pod
from tests.support.router_process import RouterProcess, router_args
from tests.support.upstream_chart import chart_container

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "endpoints.yaml"
SCRIPT = shutil.which("stargate-router")

pytestmark = pytest.mark.skipif(SCRIPT is None, reason="the stargate-router console script is not installed")


EXAMPLE_PODS = (("stargate-0", "127.0.0.2"), ("stargate-1", "127.0.0.3"))
EXAMPLE_GRPC_PORT = 50051
"""The pods and gRPC port deploy/examples/endpoints.yaml names."""


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    assert SCRIPT is not None
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)


def test_version_prints_the_build_info_version_label_and_exits_0() -> None:
    proc = run_script("--version")
    assert proc.returncode == 0, proc.stderr
    version = proc.stdout.strip()
    assert version and proc.stdout == version + "\n"
    with RouterProcess([
        "--listen-addr", "127.0.0.1:0", "--reverse-tunnel-listen-addr", "127.0.0.1:0",
        "--health-listen-addr", "127.0.0.1:0", "--endpoints-file", str(EXAMPLE),
        "--shutdown-delay-ms", "0",
    ]) as router:
        router.wait_listening()
        assert router.metric(c.BUILD_INFO, version=version) == 1
        assert router.stop() == 0


def test_the_rust_routers_command_name_is_the_same_entry_point() -> None:
    """The Rust router's chart runs ``/usr/local/bin/stargate-k8s-router``: our image has it."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["stargate-k8s-router"] == scripts["stargate-router"] == "router.cli:entrypoint"
    k8s_script = shutil.which("stargate-k8s-router")
    assert k8s_script is not None, "pip install -e . installs both console scripts"
    proc = subprocess.run([k8s_script, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stdout) == (0, run_script("--version").stdout)


def test_the_charts_args_start_the_router_with_one_line_naming_the_flags_without_effect() -> None:
    """The chart's args (its listeners moved to free loopback ports: argparse keeps a flag's last value)."""
    args = [*chart_container().args, *router_args(EXAMPLE, "--target-namespace", "stargate")]
    with RouterProcess(args) as router:
        router.wait_ready()
        assert router.http_get("/livez") == (200, "ok\n")
        warnings = [line for line in router.lines if "no effect at L4" in line]
        assert len(warnings) == 1 and "--tls-cert-path, --tls-key-path, --quic-insecure" in warnings[0]
        assert router.stop() == 0


def test_help_lists_every_subcommand_with_its_summary() -> None:
    proc = run_script("--help")
    assert proc.returncode == 0, proc.stderr
    assert "--endpoints-file" in proc.stdout and "--version" in proc.stdout
    listing = proc.stdout.partition("subcommands:")[2]
    for name, sub in SUBCOMMANDS.items():
        assert f"  {name}  " in listing and sub.summary in listing, name
    assert "demo" in SUBCOMMANDS


def test_demo_help_says_what_the_demo_does_without_running_it() -> None:
    proc = run_script("demo", "--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    for fact in ("127.0.0.2", "127.0.0.3", "h2c", "TLS", "QUIC", "UNAVAILABLE", "INVALID_ARGUMENT"):
        assert fact in text, fact
    assert "router:" not in proc.stdout  # the demo's own output: it did not start


def test_a_subcommand_given_an_unknown_argument_is_a_usage_error() -> None:
    proc = run_script("demo", "--bogus")
    assert proc.returncode == 2
    assert "stargate-router demo" in proc.stderr and "--bogus" in proc.stderr


def test_an_unknown_flag_is_a_usage_error_naming_it() -> None:
    proc = run_script("--bogus")
    assert proc.returncode == 2
    assert "--bogus" in proc.stderr


def example_router() -> RouterProcess:
    """The router process on the example endpoints file, every listener on a free loopback port."""
    return RouterProcess(router_args(EXAMPLE, "--target-namespace", "stargate"))


def test_router_loads_the_example_endpoints_file_with_both_pods_ready() -> None:
    with example_router() as router:
        router.wait_ready()
        assert router.metric(c.READY_TARGETS) == 2
        assert router.stop() == 0


def readme_grpcio_snippet() -> str:
    section = (ROOT / "README.md").read_text().partition("## Route your own pods")[2].partition("\n## ")[0]
    return section.partition("```python\n")[2].partition("```")[0]


@pytest.fixture
def example_pods() -> Iterator[list[RunningPod]]:
    pods: list[RunningPod] = []
    try:
        for name, address in EXAMPLE_PODS:
            try:
                pods.append(start_pod(name, address, EXAMPLE_GRPC_PORT))
            except (OSError, RuntimeError) as exc:
                pytest.skip(f"{address}:{EXAMPLE_GRPC_PORT} is taken: {exc}")
        yield pods
    finally:
        for pod in pods:
            pod.stop()


def test_readme_grpcio_snippet_reaches_the_pod_it_names(example_pods: list[RunningPod]) -> None:
    with example_router() as router:
        router.wait_ready()
        snippet = readme_grpcio_snippet()
        assert '"127.0.0.1:50071"' in snippet and "stargate-0.stargate.external" in snippet
        scope: dict[str, Any] = {}
        exec(snippet.replace("127.0.0.1:50071", f"127.0.0.1:{router.grpc_port}"), scope)
        with scope["channel"] as channel:
            assert call_whoami(channel) == "stargate-0"
        assert router.stop() == 0

"""``stargate-router check`` through the installed console script, as an operator runs it before
a rollout: against endpoints files and against the loopback Kubernetes API (tests/support/fake_kube_api.py).

Every run is bounded by ``RUN_BOUND_S`` (a hang fails the test); no test asserts a duration.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.fake_kube_api import FakeKubeApi, make_endpoint, make_slice
from tests.support.upstream_chart import chart_container

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "endpoints.yaml"
SCRIPT = shutil.which("stargate-router")
RUN_BOUND_S = 30.0
"""No check may take this long: every failure mode (even a silent API) must end well before."""

pytestmark = pytest.mark.skipif(SCRIPT is None, reason="the stargate-router console script is not installed")

EXAMPLE_TABLE = [
    "stargate-0.stargate.external -> stargate-0 grpc 127.0.0.2:50051 quic 127.0.0.2:50052",
    "stargate-1.stargate.external -> stargate-1 grpc 127.0.0.3:50051 quic 127.0.0.3:50052",
]


@dataclass(frozen=True, slots=True)
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return self.stderr.splitlines()


def _env(home: Path | None = None) -> dict[str, str]:
    """The test's environment without the variables that steer discovery (a developer's kubeconfig
    or an in-cluster run must not change what these tests see)."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "POD_NAMESPACE")}
    if home is not None:
        env["HOME"] = str(home)
    return env


def check(*args: str, home: Path | None = None, module: bool = False) -> Run:
    assert SCRIPT is not None
    command = [sys.executable, "-m", "router", "check"] if module else [SCRIPT, "check"]
    proc = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=RUN_BOUND_S, cwd=ROOT, check=False, env=_env(home),
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


async def check_async(*args: str) -> Run:
    """The same, without blocking the loop that serves the fake API."""
    assert SCRIPT is not None
    proc = await asyncio.create_subprocess_exec(
        SCRIPT, "check", *args, cwd=ROOT, env=_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), RUN_BOUND_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


async def check_api(api: FakeKubeApi, tmp_path: Path, *args: str) -> Run:
    """``check`` with a kubeconfig pointing at ``api`` and namespace ``stargate``."""
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    return await check_async("--kubeconfig", str(kubeconfig), "--target-namespace", "stargate", *args)


def assert_one_error_line(run: Run, *facts: str) -> None:
    assert run.returncode == 2, run
    assert run.stdout == "", run
    assert len(run.error_lines) == 1, run.stderr
    line = run.error_lines[0]
    assert line.startswith("stargate-router check: error: "), line
    for fact in facts:
        assert fact in line, (fact, line)


# ---------------------------------------------------------------------------
# endpoints files
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("module", [False, True], ids=["console-script", "python-m-router"])
def test_the_example_file_prints_one_line_per_pod_sorted_then_a_summary(module: bool) -> None:
    run = check("--endpoints-file", "deploy/examples/endpoints.yaml", "--target-namespace", "stargate",
                module=module)
    assert run.returncode == 0, run
    assert run.stderr == ""
    assert run.stdout.splitlines() == [*EXAMPLE_TABLE, "2 ready targets from file deploy/examples/endpoints.yaml"]


def test_the_table_uses_the_routers_template_port_names_and_readiness_rules(tmp_path: Path) -> None:
    ports = [{"name": "tunnel", "port": 7443, "protocol": "UDP"}, {"name": "rpc", "port": 7000}]
    document = {"kind": "List", "items": [
        make_slice("b", [make_endpoint("pod-b", "fd00::2"), make_endpoint("pod-c", "10.0.0.3", ready=False)],
                   ports=ports),
        make_slice("a", [make_endpoint("pod-a", "10.0.0.1"), make_endpoint("pod-d", "10.0.0.4", terminating=True)],
                   ports=ports),
        make_slice("other", [make_endpoint("pod-x", "10.0.0.9")], service="other", ports=ports),
    ]}
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps(document))
    run = check("--endpoints-file", str(path), "--target-namespace", "prod", "--grpc-port-name", "rpc",
                "--quic-port-name", "tunnel", "--advertised-hostname-template", "{pod_name}.{namespace}.example")
    assert run.returncode == 0, run
    assert run.stdout.splitlines() == [
        "pod-a.prod.example -> pod-a grpc 10.0.0.1:7000 quic 10.0.0.1:7443",
        "pod-b.prod.example -> pod-b grpc [fd00::2]:7000 quic [fd00::2]:7443",
        f"2 ready targets from file {path}",
    ]


@pytest.mark.parametrize(
    "content", ["", "# nothing yet\n", "kind: List\nitems: []\n"], ids=["empty", "comment", "no-items"],
)
def test_a_file_without_ready_targets_warns_and_exits_0(tmp_path: Path, content: str) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_text(content)
    run = check("--endpoints-file", str(path), "--target-namespace", "stargate")
    assert run.returncode == 0, run
    assert run.stdout.splitlines() == [f"0 ready targets from file {path}"]
    assert len(run.error_lines) == 1 and "warning" in run.stderr and "not ready" in run.stderr, run.stderr


@pytest.mark.parametrize(
    ("content", "fact"),
    [
        ("items: [\n", "not valid YAML"),
        ("just a string\n", "expected a mapping"),
        ("kind: List\nitems: {a: 1}\n", "items must be a list"),
        ("kind: List\nitems: [1, 2]\n", "expected a mapping"),
        (b"\xff\xfe\x00garbage", "UnicodeDecodeError"),
    ],
    ids=["invalid-yaml", "scalar", "items-not-a-list", "items-not-slices", "not-utf8"],
)
def test_an_invalid_file_is_one_error_line_naming_it(tmp_path: Path, content: str | bytes, fact: str) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    run = check("--endpoints-file", str(path), "--target-namespace", "stargate")
    assert_one_error_line(run, "--endpoints-file", str(path), fact)


def test_a_missing_file_is_one_error_line_naming_the_flag_and_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    run = check("--endpoints-file", str(missing), "--target-namespace", "stargate")
    assert_one_error_line(run, "--endpoints-file", str(missing))


# ---------------------------------------------------------------------------
# flags
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "flag"),
    [
        ((), "--target-namespace"),
        (("--target-namespace", "s", "--workers", "0"), "--workers"),
        (("--target-namespace", "s", "--connect-timeout-ms", "soon"), "--connect-timeout-ms"),
        (("--target-namespace", "s", "--listen-addr", "nowhere"), "--listen-addr"),
        (("--target-namespace", "s", "--advertised-hostname-template", "{pod}.x"), "--advertised-hostname-template"),
        (("--target-namespace", "s", "--advertised-hostname-template", "{pod_name}.é"),
         "--advertised-hostname-template"),
        (("--target-namespace", "s", "--kubeconfig", "/nonexistent/kubeconfig"), "--kubeconfig"),
        (("--target-namespace", "s", "--bogus"), "--bogus"),
        (("--target-namespace",), "--target-namespace"),
        (("--target-namespace", "s", "--accept-proxy-protocol"), "--proxy-protocol-trusted-cidrs"),
    ],
    ids=["no-namespace", "workers", "timeout", "listen-addr", "template-field", "template-ascii", "kubeconfig",
         "unknown-flag", "missing-value", "proxy-without-trusted-cidrs"],
)
def test_a_bad_flag_is_one_error_line_naming_it(args: tuple[str, ...], flag: str) -> None:
    run = check(*args, "--endpoints-file", str(EXAMPLE))
    assert_one_error_line(run, flag)


def test_trusting_every_proxy_source_is_said_on_one_warning_line() -> None:
    run = check("--target-namespace", "s", "--endpoints-file", str(EXAMPLE), "--accept-proxy-protocol",
                "--proxy-protocol-trusted-cidrs=0.0.0.0/0,::/0")
    assert (run.returncode, run.stdout.splitlines()[:2]) == (0, EXAMPLE_TABLE), run
    [warning] = run.error_lines
    assert warning.startswith("stargate-router check: warning: --proxy-protocol-trusted-cidrs trusts every source: ")


def test_check_help_describes_the_table_and_lists_the_routers_flags() -> None:
    run = check("--help")
    assert run.returncode == 0, run
    for fact in ("<hostname> -> <pod> grpc <address:port> quic <address:port>", "--endpoints-file", "--kubeconfig",
                 "--connect-timeout-ms", "--target-namespace", "--workers"):
        assert fact in run.stdout, fact


def test_no_kubeconfig_anywhere_is_one_error_line_saying_what_to_pass(tmp_path: Path) -> None:
    run = check("--target-namespace", "stargate", home=tmp_path)
    assert_one_error_line(run, "kubeconfig", "not found", "--kubeconfig")


# ---------------------------------------------------------------------------
# the Kubernetes API (one LIST)
# ---------------------------------------------------------------------------
async def test_one_list_through_the_api_prints_the_services_ready_pods(api: FakeKubeApi, tmp_path: Path) -> None:
    api.upsert(make_slice("stargate-headless-b", [make_endpoint("stargate-1", "10.0.0.2"),
                                                  make_endpoint("stargate-2", "10.0.0.3", serving=False)]))
    api.upsert(make_slice("stargate-headless-a", [make_endpoint("stargate-0", "fd00::1")]))
    api.upsert(make_slice("other-a", [make_endpoint("other-0", "10.0.9.9")], service="other"))
    api.upsert(make_slice("elsewhere", [make_endpoint("x-0", "10.0.8.8")], namespace="other-ns"))
    run = await check_api(api, tmp_path)
    assert run.returncode == 0, run
    assert run.stderr == ""
    assert run.stdout.splitlines() == [
        "stargate-0.stargate.external -> stargate-0 grpc [fd00::1]:50051 quic [fd00::1]:50052",
        "stargate-1.stargate.external -> stargate-1 grpc 10.0.0.2:50051 quic 10.0.0.2:50052",
        "2 ready targets from kubernetes stargate/stargate-headless",
    ]
    assert [r.kind for r in api.requests] == ["list"]  # one LIST, never a watch
    assert api.requests[0].query["labelSelector"] == "kubernetes.io/service-name=stargate-headless"


async def test_the_charts_args_print_its_services_pods_and_name_the_flags_without_effect(
    api: FakeKubeApi, tmp_path: Path,
) -> None:
    """Checking a switch from the Rust router: its chart's args, unchanged, against the API."""
    args = chart_container().args
    api.upsert(make_slice("llm-request-router-a", [make_endpoint("stargate-0", "10.0.0.5")],
                          service="llm-request-router", namespace="nvcf"))
    run = await check_async("--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")), *args)
    assert run.returncode == 0, run
    assert run.stdout.splitlines()[0] == (
        "stargate-0.llm-request-router-headless.nvcf.svc.cluster.local -> stargate-0 "
        "grpc 10.0.0.5:50051 quic 10.0.0.5:50052"
    )
    assert run.error_lines == [
        "stargate-router check: warning: flags with no effect at L4: --tls-cert-path, --tls-key-path, "
        "--quic-insecure (the router holds no certificate: TLS and QUIC end at the pod)"
    ]


async def test_an_api_listing_no_ready_pod_warns_and_exits_0(api: FakeKubeApi, tmp_path: Path) -> None:
    api.upsert(make_slice("stargate-headless-a", [make_endpoint("stargate-0", "10.0.0.1", ready=False)]))
    run = await check_api(api, tmp_path)
    assert run.returncode == 0, run
    assert run.stdout.splitlines() == ["0 ready targets from kubernetes stargate/stargate-headless"]
    assert len(run.error_lines) == 1 and "warning" in run.stderr, run.stderr


@pytest.mark.parametrize("status", [403, 500, 503])
async def test_an_api_refusing_the_list_is_one_error_line_with_its_status(
    api: FakeKubeApi, tmp_path: Path, status: int,
) -> None:
    api.fail_next(status, count=10)
    run = await check_api(api, tmp_path)
    assert_one_error_line(run, "Kubernetes API", api.url, f"HTTP {status}", f"injected {status}")
    assert len(api.requests) == 1  # no retries: check reports, the router retries


async def test_an_api_that_does_not_answer_in_time_is_one_error_line_naming_the_flag(
    api: FakeKubeApi, tmp_path: Path,
) -> None:
    api.latency_s = RUN_BOUND_S  # accepts, then stays silent past any bound
    run = await check_api(api, tmp_path, "--connect-timeout-ms", "300")
    assert_one_error_line(run, "Kubernetes API", api.url, "--connect-timeout-ms 300")


async def test_an_unreachable_api_is_one_error_line_within_a_bounded_time(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on: connections are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    closed = FakeKubeApi()  # never started: only its kubeconfig writer is used
    closed.port = port
    run = await check_api(closed, tmp_path)
    assert_one_error_line(run, "Kubernetes API", f"127.0.0.1:{port}")

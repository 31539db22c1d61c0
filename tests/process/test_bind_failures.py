"""A listener that cannot bind ends the router with one stderr line naming its flag, and status 2.

Through the installed console script, as an operator meets it: each of the three listener
flags, on a port another socket holds, on an address this host does not have, and on a low
port as a user without the privilege; in one process and with ``--workers 2`` (where the
supervisor finds it before starting workers, or a worker finds it and the supervisor stops).
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from router.app import RouterApp
from router.bind_failure import REASONS, BindFailure, binding, reason
from router.config import config_from_args
from router.extensions import Extensions
from router.flag_values import CONFIG_ERROR_PREFIX, ConfigError, SocketAddress
from tests.support.router_process import extensions_env

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "endpoints.yaml"
SCRIPT = shutil.which("stargate-router")
RUN_BOUND_S = 60.0
"""No failing start may take this long (a restart loop would)."""

TCP, UDP, HEALTH = "--listen-addr", "--reverse-tunnel-listen-addr", "--health-listen-addr"
NOT_HERE = "192.0.2.1"
"""TEST-NET-1 (RFC 5737): an address no host of ours has."""
NOBODY = 65534
LOW_PORT = 80

pytestmark = pytest.mark.skipif(SCRIPT is None, reason="the stargate-router console script is not installed")


def router_command(*args: str, workers: int = 1) -> list[str]:
    """``stargate-router`` with every listener on loopback port 0 unless ``args`` says otherwise."""
    assert SCRIPT is not None
    return [
        SCRIPT, "--endpoints-file", str(EXAMPLE), "--target-namespace", "stargate", "--shutdown-delay-ms", "0",
        TCP, "127.0.0.1:0", UDP, "127.0.0.1:0", HEALTH, "127.0.0.1:0", "--workers", str(workers), *args,
    ]


def run_router(
    *args: str, workers: int = 1, as_user: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``as_user``: the command that runs it as another user; ``env``: added to this process's environment."""
    command = [*as_user, *router_command(*args, workers=workers)]
    return subprocess.run(command, capture_output=True, text=True, timeout=RUN_BOUND_S, cwd=ROOT, check=False,
                          env={**os.environ, **(env or {})})


def assert_one_line(proc: subprocess.CompletedProcess[str], flag: str, address: str, code: int) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"{CONFIG_ERROR_PREFIX}{flag} {address}: {REASONS[code]}"], proc.stderr


def held(flag: str) -> socket.socket:
    """A socket holding a loopback port the way another program would (no SO_REUSEPORT)."""
    if flag == UDP:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        return sock
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.fixture(params=[TCP, UDP, HEALTH])
def flag(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=[1, 2], ids=["one-process", "workers-2"])
def workers(request: pytest.FixtureRequest) -> int:
    return int(request.param)


# ---------------------------------------------------------------------------
# Through the console script
# ---------------------------------------------------------------------------
def test_a_port_another_socket_holds_is_one_line_naming_the_flag_and_status_2(flag: str, workers: int) -> None:
    with held(flag) as holder:
        address = f"127.0.0.1:{holder.getsockname()[1]}"
        proc = run_router(flag, address, workers=workers)
    assert_one_line(proc, flag, address, errno.EADDRINUSE)


def test_a_held_udp_port_is_one_line_on_either_quic_path(extensions: Extensions) -> None:
    with held(UDP) as holder:
        address = f"127.0.0.1:{holder.getsockname()[1]}"
        proc = run_router(UDP, address, env=extensions_env(extensions))
    assert_one_line(proc, UDP, address, errno.EADDRINUSE)


def test_an_address_not_on_this_host_is_one_line_naming_the_flag_and_status_2(flag: str, workers: int) -> None:
    with socket.socket() as probe:
        try:
            probe.bind((NOT_HERE, 0))
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL:
                pytest.skip(f"binding {NOT_HERE} fails otherwise here: {exc}")
        else:
            pytest.skip(f"{NOT_HERE} is an address of this host")
    address = f"{NOT_HERE}:50071"
    assert_one_line(run_router(flag, address, workers=workers), flag, address, errno.EADDRNOTAVAIL)


@pytest.fixture(scope="module")
def as_nobody() -> list[str]:
    """The command prefix that runs the console script as uid/gid 65534, no capabilities; skips
    (saying why) where EACCES for a low port cannot be shown: the unit test
    ``test_reasons_are_words_for_the_errnos_an_operator_meets`` checks its words everywhere."""
    if os.geteuid() != 0:
        pytest.skip("running the router as another user needs root")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    first_free = int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    if first_free <= LOW_PORT:
        pytest.skip(f"net.ipv4.ip_unprivileged_port_start is {first_free}: anyone may bind port {LOW_PORT}")
    prefix = [setpriv, "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
    assert SCRIPT is not None
    if subprocess.run([*prefix, SCRIPT, "--version"], capture_output=True, cwd=ROOT, check=False).returncode != 0:
        pytest.skip(f"uid {NOBODY} cannot run {SCRIPT} here")
    return prefix


def test_a_low_port_as_an_unprivileged_user_is_one_line_naming_the_flag_and_status_2(
    flag: str, workers: int, as_nobody: list[str]
) -> None:
    address = f"127.0.0.1:{LOW_PORT}"
    assert_one_line(run_router(flag, address, workers=workers, as_user=as_nobody), flag, address, errno.EACCES)


@pytest.mark.parametrize("flag", [TCP, UDP])
def test_no_program_can_take_a_port_between_the_supervisors_check_and_the_workers_bind(flag: str) -> None:
    """The supervisor binds each listener's port itself and holds it until every worker has bound it
    too (``held_address``): another program that tries to take it while the workers start (they are
    still importing when the supervisor logs their start) is refused, and the router comes up."""
    with held(flag) as probe:
        port = probe.getsockname()[1]
    command = router_command(flag, f"127.0.0.1:{port}", workers=2)
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stderr is not None
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if "worker 0 started" in line:
                break
        intruder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if flag == UDP else socket.SOCK_STREAM)
        with intruder, pytest.raises(OSError) as refused:
            intruder.bind(("127.0.0.1", port))
        assert refused.value.errno == errno.EADDRINUSE
        for line in proc.stderr:
            lines.append(line)
            if "listening grpc=" in line:
                break
        assert any("listening grpc=" in line for line in lines), "".join(lines)
    finally:
        proc.terminate()
        rest = proc.communicate(timeout=RUN_BOUND_S)[1]
    assert proc.returncode == 0, "".join(lines) + rest


def test_a_config_error_only_the_workers_find_is_said_once_on_their_control_pipes() -> None:
    """A template the flag parser takes but the router refuses (not ASCII): every worker reports it on
    the pipe the supervisor made, and the supervisor says it once, restarts none, and exits 2."""
    proc = run_router("--advertised-hostname-template", "{pod_name}.stargate.\u00e9xternal", workers=2)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith(CONFIG_ERROR_PREFIX)]
    assert len(errors) == 1 and "--advertised-hostname-template" in errors[0], proc.stderr
    assert "restarting" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------
# In the process
# ---------------------------------------------------------------------------
def _free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_listener_that_cannot_bind_lets_go_of_those_already_bound() -> None:
    health, grpc = _free_tcp_port(), _free_tcp_port()
    with held(UDP) as holder:
        config = config_from_args([
            "--endpoints-file", str(EXAMPLE), "--target-namespace", "stargate", HEALTH, f"127.0.0.1:{health}",
            TCP, f"127.0.0.1:{grpc}", UDP, f"127.0.0.1:{holder.getsockname()[1]}",
        ])
        app = RouterApp(config)
        with pytest.raises(BindFailure) as raised:
            await app.start()
    assert raised.value.flag == UDP
    for port in (health, grpc):  # the health and gRPC listeners bound first, and are closed again
        with socket.socket() as again:
            again.bind(("127.0.0.1", port))
            again.listen()


def test_reasons_are_words_for_the_errnos_an_operator_meets() -> None:
    assert reason(OSError(errno.EADDRINUSE, "Address already in use")) == "address already in use"
    assert reason(OSError(errno.EADDRNOTAVAIL, "x")) == "address not available on this host"
    assert reason(OSError(errno.EACCES, "x")).startswith("permission denied (")
    assert "CAP_NET_BIND_SERVICE" in reason(OSError(errno.EACCES, "x"))
    assert reason(OSError(errno.EMFILE, "x")) == os.strerror(errno.EMFILE).lower()


def test_the_reason_is_found_on_the_cause_when_the_loop_drops_the_errno() -> None:
    """uvloop's ``create_datagram_endpoint`` raises ``OSError("could not bind ...")`` from the kernel's."""
    try:
        try:
            raise OSError(errno.EADDRINUSE, "Address already in use")
        except OSError as kernel:
            raise OSError("could not bind to local_addr ('127.0.0.1', 1)") from kernel
    except OSError as loop_error:
        assert reason(loop_error) == "address already in use"


def test_binding_turns_an_os_error_into_a_config_error_naming_flag_and_address() -> None:
    with pytest.raises(ConfigError) as raised, binding(HEALTH, SocketAddress("::1", 8080)):
        raise OSError(errno.EADDRINUSE, "Address already in use")
    assert str(raised.value) == f"{HEALTH} [::1]:8080: address already in use"

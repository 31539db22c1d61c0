"""The optional C extensions are built where they can be, and the router runs without them where they are not."""

from __future__ import annotations

import asyncio
import platform
import re
import shutil
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from discovery.targets import Target, TargetSnapshot
from router import constants as c
from router.demo.pki import DemoPki
from router.extensions import (
    INITIALS_MODULE,
    SPLICE_MODULE,
    TCP_PUMP_MODULE,
    Extensions,
    NativeUnavailable,
    choose,
    is_built,
)
from router.tcp import native_relay
from router.udp import native
from router.udp.settings import UdpRouterSettings
from tests.support.quic_exchange import POD_HOST, quic_exchange
from tests.support.router_process import RouterProcess, router_args
from tests.support.udp_router import running_udp_router

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "endpoints.yaml"


@pytest.mark.skipif(sys.platform != "linux" or not (shutil.which("cc") or shutil.which("gcc")),
                    reason="no C compiler here, or not Linux (recvmmsg/sendmmsg are Linux's)")
def test_the_splice_is_built_wherever_a_compiler_was() -> None:
    """CI installs with a compiler: there the splice must be built, or its tests would skip unseen."""
    assert is_built(SPLICE_MODULE)


@pytest.mark.skipif(sys.platform != "linux" or not (shutil.which("cc") or shutil.which("gcc"))
                    or not Path("/usr/include/openssl/evp.h").exists(),
                    reason="no C compiler or no OpenSSL headers (libssl-dev) here")
def test_the_initial_protection_is_built_wherever_a_compiler_and_openssl_headers_were() -> None:
    """CI installs libssl-dev: there the C Initial path must be built, or its tests would skip unseen."""
    assert is_built(INITIALS_MODULE)


@pytest.mark.skipif(sys.platform != "linux" or not (shutil.which("cc") or shutil.which("gcc")),
                    reason="no C compiler here, or not Linux (epoll and splice are Linux's)")
def test_the_tcp_relay_pump_is_built_wherever_a_compiler_was() -> None:
    """CI installs with a compiler: there the C pump must be built, or its tests would skip unseen."""
    assert is_built(TCP_PUMP_MODULE)


def test_without_the_c_relay_the_python_pump_is_chosen_and_requiring_it_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "router.tcp._relay", None)
    assert not is_built(TCP_PUMP_MODULE)

    assert not choose({}).tcp_pump
    with pytest.raises(NativeUnavailable, match="not built"):
        Extensions(tcp_pump=True).require()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert native_relay.engine_for(loop, False) is None
        with pytest.raises(native_relay.NativeUnavailable, match="not built"):
            native_relay.engine_for(loop, True)

    asyncio.run(main())


@pytest.fixture
def no_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if the install had no compiler: importing the extension fails."""
    monkeypatch.setitem(sys.modules, "router.udp._splice", None)


@pytest.mark.usefixtures("no_extension")
def test_without_the_extension_the_pure_python_path_is_chosen_and_requiring_it_says_why() -> None:
    assert not is_built(SPLICE_MODULE)
    assert not choose({}).splice
    with pytest.raises(NativeUnavailable, match="not built"):
        UdpRouterSettings(extensions=Extensions(splice=True))


@pytest.mark.usefixtures("no_extension")
async def test_without_the_extension_a_quic_stream_still_goes_through_the_router(pki: DemoPki) -> None:
    splicers: list[object] = []

    @asynccontextmanager
    async def router_to(pod_port: int) -> AsyncIterator[int]:
        snapshot = TargetSnapshot.of([Target("stargate-0", POD_HOST, 1, pod_port)])
        chosen = UdpRouterSettings(extensions=choose({}))  # what a router here would choose: no splice
        async with running_udp_router(lambda: snapshot, chosen) as (router, port):
            splicers.append(getattr(router.path, "splicer", None))
            yield port

    payload = bytes(range(256)) * 400
    received, got = await quic_exchange(pki, payload, b"ok", router_to)
    assert (received, got) == (payload, b"ok")
    assert splicers == [None]


def _io_uring_opens() -> bool:
    """Whether this kernel (and seccomp profile) gives the C splice an io_uring."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        splicer_type = native.splicer_type(Extensions(splice=True))
        assert splicer_type is not None
        return splicer_type(sock.fileno(), 1, 1).io_uring


@pytest.mark.parametrize("switch", ["", c.NO_EXTENSIONS_ENV, c.NO_IO_URING_ENV])
def test_the_router_says_at_start_which_datapath_carries_quic_flows(switch: str) -> None:
    env = {c.NO_EXTENSIONS_ENV: "", c.NO_IO_URING_ENV: ""} | ({switch: "1"} if switch else {})
    switched_off = switch == c.NO_EXTENSIONS_ENV
    expected = "python" if switched_off or not is_built(SPLICE_MODULE) else \
        "c_splice+io_uring" if not switch and _io_uring_opens() else "c_splice"
    initials = "python" if switched_off or not is_built(INITIALS_MODULE) else "c"
    pump = "python" if switched_off or not is_built(TCP_PUMP_MODULE) else "c"
    with RouterProcess(router_args(EXAMPLE, "--target-namespace", "stargate"), env=env) as router:
        router.wait_listening()
        wanted = f"quic_datapath={expected} quic_initials={initials} tcp_pump={pump}"
        assert any(wanted in line for line in router.lines)
        assert router.stop() == 0


@pytest.mark.skipif(platform.machine() != "x86_64" or not is_built(SPLICE_MODULE),
                    reason="the seccomp filter is x86-64's; the splice is not built")
def test_a_seccomp_profile_that_refuses_io_uring_leaves_the_splice_on_sendmmsg_and_says_why() -> None:
    """containerd 2's RuntimeDefault profile refuses io_uring_setup: the router still splices."""
    env = {c.NO_EXTENSIONS_ENV: "", c.NO_IO_URING_ENV: ""}
    args = router_args(EXAMPLE, "--target-namespace", "stargate")
    with RouterProcess(args, env=env, module="tests.support.no_io_uring") as router:
        router.wait_listening()
        assert any("quic_datapath=c_splice quic_initials=" in line for line in router.lines)
        assert any("io_uring refused (EPERM): the C splice sends to each pod with sendmmsg" in line
                   for line in router.lines)
        assert router.stop() == 0


def test_the_sdist_carries_every_header_the_c_sources_include() -> None:
    """setuptools puts an extension's sources in the sdist, not the headers they include: a wheel
    built from an sdist without them (``python -m build``) would silently lack the extension."""
    root = EXAMPLE.parents[2]
    manifest = {line.strip() for line in (root / "MANIFEST.in").read_text().splitlines()}
    for source in [*root.glob("router/**/*.c"), *root.glob("quic/**/*.c")]:
        for header in re.findall(r'^#include "([^"]+)"', source.read_text(), re.MULTILINE):
            if not (source.parent / header).exists():
                continue  # the system's or Python's (structmember.h)
            path = (source.parent / header).resolve().relative_to(root)
            assert f"include {path}" in manifest, f"{source.name} includes {header}: add it to MANIFEST.in"

"""Fixtures the whole suite shares: the demo PKI, the quinn test peer, the loopback fake Kubernetes
API, and the two paths (pure Python, C extensions) a test runs on.

Byte builders and harnesses that are not fixtures live in ``tests/support/``
(``eventually`` in ``tests.support.polling``, an in-process QUIC edge in
``tests.support.udp_router``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from router.demo.pki import DemoPki, make_pki
from router.extensions import PYTHON, Extensions, choose
from tests.support import quinn_client
from tests.support.fake_kube_api import FakeKubeApi


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DemoPki:
    """A CA and a server certificate for the demo names, made once per run (key generation is slow)."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def quinn_peer() -> Path:
    """The quinn test peer's binary (a second QUIC stack beside aioquic), built once per run
    (skipped where it cannot be built)."""
    binary, why_not = quinn_client.build()
    if binary is None:
        pytest.skip(f"the quinn peer cannot be built here: {why_not}")
    return binary


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    """The fake Kubernetes API (EndpointSlice list + watch) on loopback, fresh for each test."""
    server = FakeKubeApi()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture(scope="module", params=["python", "c"])
def extensions(request: pytest.FixtureRequest) -> Extensions:
    """Run the test on the pure-Python reference, then on the C extensions (skipped where they are
    not built). The test passes the value to what it starts: an in-process edge's settings
    (``UdpRouterSettings``, ``TcpRouterSettings``, the harnesses that make them), ``relay(native=
    extensions.tcp_pump)``, or a router process's environment (``router_process.extensions_env``).
    A test of one path narrows it: ``@pytest.mark.parametrize("extensions", ["c"], indirect=True)``.
    Module-scoped (the value never changes), so a module's shared router may depend on it: a
    module's tests run on one path, then on the other."""
    if request.param == "python":
        return PYTHON
    built = choose({})  # every extension this install built, the splice's io_uring sends included
    if not (built.splice and built.tcp_pump):
        pytest.skip("the C extensions are not built (no C compiler at install)")
    return built

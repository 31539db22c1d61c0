"""Fixtures the whole suite shares: the demo PKI and the loopback fake Kubernetes API.

Byte builders and harnesses that are not fixtures live in ``tests/support/``
(``eventually`` in ``tests.support.polling``, an in-process QUIC edge in
``tests.support.udp_router``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from router import constants as c
from router.demo.pki import DemoPki, make_pki
from router.udp import native
from tests.support.fake_kube_api import FakeKubeApi


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DemoPki:
    """A CA and a server certificate for the demo names, made once per run (key generation is slow)."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    """The fake Kubernetes API (EndpointSlice list + watch) on loopback, fresh for each test."""
    server = FakeKubeApi()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture(params=["python", "native"])
def both_udp_paths(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test on the QUIC edge's pure-Python path, then on the C splice (skipped where it
    is not built): ``NO_EXTENSIONS_ENV`` reaches in-process routers and router processes alike."""
    if request.param == "python":
        monkeypatch.setenv(c.NO_EXTENSIONS_ENV, "1")
    elif not native.is_built():
        pytest.skip("the C splice is not built (no C compiler at install)")
    else:
        monkeypatch.delenv(c.NO_EXTENSIONS_ENV, raising=False)
    return str(request.param)

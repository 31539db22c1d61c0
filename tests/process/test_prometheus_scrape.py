"""A real Prometheus server scrapes the real router: every outcome series is there at 0, then counts."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from router import constants as c
from router.demo.grpc_pods import call_whoami, start_pod
from router.outcomes import TCP_PROTOCOLS, GrpcOutcome, QuicOutcome
from tests.support.polling import eventually_blocking
from tests.support.router_process import RouterProcess, router_args, write_endpoints

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Prometheus:
    def __init__(self, workdir: Path, target_port: int) -> None:
        self.port = _free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: stargate-router\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
        )
        self.proc = subprocess.Popen(
            [
                "prometheus", f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def query(self, promql: str) -> list[dict[str, object]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.load(resp)
        result: list[dict[str, object]] = body["data"]["result"]
        return result

    def wait_for(self, promql: str, predicate: object, timeout: float = 30.0) -> list[dict[str, object]]:
        last: list[dict[str, object]] = []

        def met() -> bool:
            nonlocal last
            try:
                last = self.query(promql)
            except OSError:  # Prometheus still starting
                return False
            return callable(predicate) and bool(predicate(last))

        eventually_blocking(met, timeout, 0.3, what=lambda: f"{promql}: condition not met, last result {last}")
        return last

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def scraped_router(tmp_path: Path) -> Iterator[tuple[RouterProcess, Prometheus, int]]:
    pod = start_pod("stargate-0", "127.0.0.2")
    write_endpoints(tmp_path / "e.json", [("stargate-0", pod.address, pod.port, 1)])
    router = RouterProcess(router_args(tmp_path / "e.json"))
    prom: Prometheus | None = None
    try:
        router.wait_ready()
        prom = Prometheus(tmp_path, router.health_port)
        yield router, prom, pod.port
    finally:
        if prom is not None:
            prom.stop()
        router.stop()
        pod.stop()


def _values(result: list[dict[str, object]]) -> dict[tuple[str, ...], float]:
    out = {}
    for r in result:
        metric = r["metric"]
        assert isinstance(metric, dict)
        value = r["value"]
        assert isinstance(value, list)
        out[tuple(f"{k}={v}" for k, v in sorted(metric.items()) if k not in ("job", "instance", "__name__"))] = (
            float(value[1])
        )
    return out


def test_every_outcome_series_is_scraped_at_zero_then_counts(
    scraped_router: tuple[RouterProcess, Prometheus, int],
) -> None:
    router, prom, _ = scraped_router
    grpc_total = c.GRPC_CONNECTIONS_TOTAL + "_total"
    quic_total = c.QUIC_CONNECTIONS_TOTAL + "_total"
    expected_grpc = len(TCP_PROTOCOLS) * len(GrpcOutcome)
    before = _values(prom.wait_for(grpc_total, lambda r: len(r) == expected_grpc))
    assert set(before.values()) == {0.0}
    assert {k for key in before for k in key if k.startswith("outcome=")} == {f"outcome={o}" for o in GrpcOutcome}
    quic = _values(prom.wait_for(quic_total, lambda r: len(r) == len(QuicOutcome)))
    assert set(quic.values()) == {0.0}
    up = prom.query("up")
    assert up and float(up[0]["value"][1]) == 1.0  # type: ignore[index]

    target = f"127.0.0.1:{router.grpc_port}"
    for authority in ("stargate-0.stargate.external", "stargate-0.stargate.external", "example.com"):
        opts = [("grpc.default_authority", authority), ("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(target, options=opts) as ch, contextlib.suppress(grpc.RpcError):
            call_whoami(ch)  # one TCP connection per call (local subchannel pool)
    accepted = f'{grpc_total}{{protocol="h2c",outcome="accepted"}}'
    prom.wait_for(accepted, lambda r: bool(r) and float(r[0]["value"][1]) == 2.0)
    unknown = f'{grpc_total}{{protocol="h2c",outcome="unknown_authority"}}'
    prom.wait_for(unknown, lambda r: bool(r) and float(r[0]["value"][1]) == 1.0)
    ready = prom.wait_for(c.READY_TARGETS, lambda r: bool(r))
    assert float(ready[0]["value"][1]) == 1.0  # type: ignore[index]

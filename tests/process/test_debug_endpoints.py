"""``--debug-endpoints``: ``/debug/targets`` and ``/debug/connections`` on the health listener of the
router process (off by default: 404), against the endpoints file, the fake Kubernetes API and
``--workers 2``; an open grpcio bidi stream shows its byte counts growing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from router.demo.grpc_pods import RunningPod, start_pod
from tests.support.fake_kube_api import FakeKubeApi, make_endpoint, make_slice
from tests.support.names import host
from tests.support.router_probes import echo_stream
from tests.support.router_process import RouterProcess, router_args, write_endpoints

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pods() -> Iterator[list[RunningPod]]:
    running = [start_pod("sg-1", "127.0.0.3"), start_pod("sg-0", "127.0.0.2")]
    try:
        yield running
    finally:
        for pod in running:
            pod.stop()


def start(tmp: Path, pods: list[RunningPod], *extra: str) -> RouterProcess:
    endpoints = tmp / "endpoints.json"
    write_endpoints(endpoints, [(p.pod_name, p.address, p.port, 7000 + i) for i, p in enumerate(pods)])
    router = RouterProcess(router_args(endpoints, *extra))
    router.wait_ready()
    return router


def get_json(router: RouterProcess, path: str) -> Any:
    status, body = router.http_get(path)
    assert status == 200, (path, status, body)
    return json.loads(body)


def test_the_debug_paths_answer_404_unless_enabled(tmp_path: Path, pods: list[RunningPod]) -> None:
    with start(tmp_path, pods) as router:
        assert router.http_get("/debug/targets")[0] == 404
        assert router.http_get("/debug/connections")[0] == 404
        assert router.http_get("/healthz")[0] == 200
        router.stop()


def test_targets_from_the_endpoints_file_sorted_by_pod(tmp_path: Path, pods: list[RunningPod]) -> None:
    with start(tmp_path, pods, "--debug-endpoints") as router:
        view = get_json(router, "/debug/targets")
        assert view["source"] == "file" and view["ready"] is True
        assert isinstance(view["last_sync_age_s"], float) and view["last_sync_age_s"] >= 0
        assert view["targets"] == [
            {"pod": "sg-0", "address": "127.0.0.2", "grpc_port": pods[1].port, "quic_port": 7001},
            {"pod": "sg-1", "address": "127.0.0.3", "grpc_port": pods[0].port, "quic_port": 7000},
        ]
        assert router.http_get("/debug/connections?limit=0")[0] == 400
        assert router.http_get("/debug/connections?limit=10001")[0] == 400
        router.stop()


def _h2c_entries(router: RouterProcess, limit: int = 100) -> list[dict[str, Any]]:
    view = get_json(router, f"/debug/connections?limit={limit}")
    assert view["total"] >= len(view["connections"])
    return [e for e in view["connections"] if e["protocol"] == "h2c"]


def test_an_open_bidi_stream_shows_growing_byte_counts(tmp_path: Path, pods: list[RunningPod]) -> None:
    with start(tmp_path, pods, "--debug-endpoints") as router:
        target = f"127.0.0.1:{router.grpc_port}"
        options = [("grpc.default_authority", host("sg-0")), ("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(target, options=options) as channel:
            outbox, replies = echo_stream(channel)
            outbox.put(b"x" * 1000)
            assert next(replies) == b"x" * 1000
            [first] = _h2c_entries(router)
            assert (first["hostname"], first["pod"]) == (host("sg-0"), "sg-0")
            assert first["client"].startswith("127.0.0.1:")
            assert first["age_s"] >= first["idle_s"] >= 0
            for _ in range(3):
                outbox.put(b"y" * 100_000)
                assert next(replies) == b"y" * 100_000
            [later] = _h2c_entries(router)
            assert later["bytes_client_to_pod"] >= first["bytes_client_to_pod"] + 300_000
            assert later["bytes_pod_to_client"] >= first["bytes_pod_to_client"] + 300_000
            with grpc.insecure_channel(target, options=options) as second:
                outbox2, replies2 = echo_stream(second)
                outbox2.put(b"z")
                assert next(replies2) == b"z"
                newest, oldest = _h2c_entries(router)
                assert newest["age_s"] <= oldest["age_s"] and newest["client"] != oldest["client"]
                assert len(_h2c_entries(router, limit=1)) == 1
                outbox2.put(None)
            outbox.put(None)
        deadline = time.monotonic() + 10
        while _h2c_entries(router) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _h2c_entries(router) == []
        router.stop()


def test_the_supervisor_merges_its_workers_answers(tmp_path: Path, pods: list[RunningPod]) -> None:
    with start(tmp_path, pods, "--debug-endpoints", "--workers", "2") as router:
        view = get_json(router, "/debug/targets")
        assert [t["pod"] for t in view["targets"]] == ["sg-0", "sg-1"] and view["ready"] is True
        target = f"127.0.0.1:{router.grpc_port}"
        channels = [
            grpc.insecure_channel(target, options=[("grpc.default_authority", host("sg-0")),
                                                   ("grpc.use_local_subchannel_pool", 1)])
            for _ in range(6)
        ]
        try:
            streams = [echo_stream(ch) for ch in channels]
            for outbox, replies in streams:
                outbox.put(b"hello")
                assert next(replies) == b"hello"
            view = get_json(router, "/debug/connections")
            assert view["total"] == 6 and len(view["connections"]) == 6
            ages = [e["age_s"] for e in view["connections"]]
            assert ages == sorted(ages)
            assert len(get_json(router, "/debug/connections?limit=2")["connections"]) == 2
            for outbox, _ in streams:
                outbox.put(None)
        finally:
            for ch in channels:
                ch.close()
        router.stop()


async def test_targets_from_the_kubernetes_api(tmp_path: Path, api: FakeKubeApi) -> None:
    api.upsert(make_slice("stargate-headless-a", [make_endpoint("sg-0", "127.0.0.2")],
                          grpc_port=5001, quic_port=5002, namespace="demo"))
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    router = RouterProcess([
        "--listen-addr", "127.0.0.1:0", "--reverse-tunnel-listen-addr", "127.0.0.1:0",
        "--health-listen-addr", "127.0.0.1:0", "--kubeconfig", str(kubeconfig),
        "--target-namespace", "demo", "--shutdown-delay-ms", "0", "--debug-endpoints",
    ])
    with router:
        await asyncio.to_thread(router.wait_ready)
        view = await asyncio.to_thread(get_json, router, "/debug/targets")
        assert view["source"] == "kubernetes" and view["ready"] is True
        assert view["targets"] == [{"pod": "sg-0", "address": "127.0.0.2", "grpc_port": 5001, "quic_port": 5002}]
        assert await asyncio.to_thread(router.stop) == 0


BAD_LIMITS = {
    "superscript-two": "%C2%B2",  # "²": str.isdigit() says yes, int() says no
    "devanagari-one": "%E0%A5%A7",  # "१": a Unicode decimal digit int() takes
    "4301-digits": "1" * 4301,  # past int()'s 4,300-digit guard
    "six-digits": "000001",  # more digits than the largest limit has
    "zero": "0",
    "over-the-max": "10001",
    "negative": "-1",
    "plus-sign": "%2B5",
    "space-padded": "+5+",  # "+" is a space in a query
    "empty": "",
    "nul": "%00",
    "not-utf8": "%FF",
}


def test_a_bad_limit_gets_400_and_one_line_naming_it(tmp_path: Path, pods: list[RunningPod]) -> None:
    """Issue 41, finding 6: ``limit=%C2%B2`` and a 4,301-digit limit passed ``isdigit()`` and failed
    ``int()``: a 500 and a traceback in the log per request. Under ``STARGATE_TEST_ROUTER_WORKERS=2``
    the supervisor answers (it parses the limit before it asks the workers)."""
    with start(tmp_path, pods, "--debug-endpoints") as router:
        answers = {name: router.http_get(f"/debug/connections?limit={value}") for name, value in BAD_LIMITS.items()}
        wrong = {name: answer for name, answer in answers.items()
                 if answer != (400, "limit: expected a whole number from 1 to 10000\n")}
        assert wrong == {}
        assert router.http_get("/debug/connections?limit=10000")[0] == 200
        assert router.stop() == 0
        assert not [line for line in router.lines if " error " in line or "Traceback" in line]


ODD_REQUESTS = [
    "/debug/connections?limit=1&limit=%ZZ",
    "/debug/connections?%",
    "/debug/connections?" + "&" * 4000,
    "/debug/connections?limit=5&" + "x=1&" * 1500,
    "/debug/connections;limit=5",
    "/debug/connections/",
    "//debug/connections",
    "/debug/targets?limit=%C2%B2",
    "/readyz?%FF%FE",
    "/metrics?name[]=%00",
    "/%",
    "/%FF",
    "/../../etc/passwd",
    "/" + "a" * 7000,
]


def test_no_path_or_query_answers_500_or_logs_a_traceback(tmp_path: Path, pods: list[RunningPod]) -> None:
    """Whatever path and query a client sends, the probe listener answers 2xx or 4xx, and the log
    holds no error line for it."""
    with start(tmp_path, pods, "--debug-endpoints") as router:
        answers = {path[:40]: router.http_get(path)[0] for path in ODD_REQUESTS}
        assert all(200 <= status < 500 for status in answers.values()), answers
        assert router.stop() == 0
        assert not [line for line in router.lines if " error " in line or "Traceback" in line]

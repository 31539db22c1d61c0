"""``stargate-router demo``: the whole path on one machine, no cluster (its ``--help`` text: ``router.cli``).

Its certificates and endpoints file are memory files (``router.demo.memory_files``): it writes nothing
to disk, so it runs under a read-only root with no writable ``/tmp``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from router import constants as c
from router.config import config_from_args
from router.demo.memory_files import MemoryFiles
from router.demo.pki import DemoPki, make_pki

PODS = (("stargate-0", "127.0.0.2"), ("stargate-1", "127.0.0.3"))
NAMESPACE = "demo"
SERVICE = c.DEFAULT_TARGET_SERVICE_NAME


def endpoint_slice(pods: Sequence[tuple[str, str, int, int]]) -> dict[str, Any]:
    """One EndpointSlice for ``(pod, ip, grpc_port, quic_port)``; pods must share ports in real
    clusters, so the demo writes one slice per pod instead (see ``endpoints_document``)."""
    name, ip, grpc_port, quic_port = pods[0]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{SERVICE}-{name}",
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": SERVICE},
        },
        "addressType": "IPv4",
        "ports": [
            {"name": "grpc", "port": grpc_port, "protocol": "TCP"},
            {"name": "quic", "port": quic_port, "protocol": "UDP"},
        ],
        "endpoints": [
            {
                "addresses": [ip],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "targetRef": {"kind": "Pod", "name": name, "namespace": NAMESPACE},
            }
        ],
    }


def endpoints_document(pods: Sequence[tuple[str, str, int, int]]) -> str:
    """An EndpointSliceList, one slice per pod (each pod listens on its own demo ports)."""
    items = [endpoint_slice([p]) for p in pods]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2)


async def _quic_calls(router_port: int, pki: DemoPki, out: list[str]) -> bool:
    from router.demo.quic_pods import quic_whoami

    ok = True
    for pod, _ip in PODS:
        host = f"{pod}.stargate.external"
        got = await quic_whoami("127.0.0.1", router_port, host, str(pki.ca_path))
        out.append(f"  quic SNI        {host:<30} -> answered by {got}")
        ok &= got == pod
    host = "stargate-9.stargate.external"
    try:
        await quic_whoami("127.0.0.1", router_port, host, str(pki.ca_path))
        out.append(f"  quic SNI        {host:<30} -> unexpectedly routed")
        ok = False
    except ConnectionError as err:
        out.append(f"  quic SNI        {host:<30} -> closed by router: {err}")
    return ok


async def _demo(files: MemoryFiles) -> int:
    from router.app import RouterApp
    from router.demo.grpc_pods import start_pod
    from router.demo.quic_pods import bound_port, start_quic_pod

    pki = make_pki(files)
    grpc_pods = []
    tls_pods = []
    quic_pods = []
    rows = []
    for pod, ip in PODS:
        h2c = start_pod(pod, ip)
        grpc_pods.append(h2c)
        tls_pods.append(start_pod(pod, ip, cert_pem=pki.cert_pem, key_pem=pki.key_pem))
        quic = await start_quic_pod(pod, ip, 0, pki.cert_path, pki.key_path)
        quic_pods.append(quic)
        rows.append((pod, ip, h2c.port, bound_port(quic)))
    # TLS pods listen on their own ports; the demo's second endpoints file swaps them in.
    endpoints = files.write("endpoints.json", endpoints_document(rows).encode())
    config = config_from_args(
        [
            "--listen-addr", "127.0.0.1:0", "--reverse-tunnel-listen-addr", "127.0.0.1:0",
            "--health-listen-addr", "127.0.0.1:0", "--target-namespace", NAMESPACE,
            "--endpoints-file", str(endpoints), "--shutdown-delay-ms", "0",
            "--drain-timeout-ms", "1000",
        ]
    )
    app = RouterApp(config)
    await app.start()
    await asyncio.wait_for(app.source.synced.wait(), 5)
    tcp_port = app.tcp_addr[1]
    udp_port = app.udp_addr[1]
    out = [
        f"router: gRPC tcp 127.0.0.1:{tcp_port}, QUIC udp 127.0.0.1:{udp_port}, "
        f"health http://127.0.0.1:{app.health_addr[1]}/metrics",
        *(f"pod {p} at {ip}: grpc h2c :{g}, quic :{q}" for p, ip, g, q in rows),
        "calls through the router:",
    ]
    def rewrite_endpoints(document: str) -> None:
        files.replace(endpoints, document.encode())

    ok = await asyncio.to_thread(_grpc_calls_h2c_then_tls, tcp_port, pki, out, rows, tls_pods, rewrite_endpoints, app)
    ok &= await _quic_calls(udp_port, pki, out)
    accepted = sum(
        app.metrics.grpc_connections.labels(protocol=p, outcome="accepted").value
        for p in ("h2c", "tls")
    )
    out.append(f"router metrics: {int(accepted)} gRPC connections accepted, "
               f"{int(app.metrics.quic_connections.labels(outcome='accepted').value)} QUIC flows accepted")
    print("\n".join(out))
    app.request_stop()
    await app.shutdown()
    for p in grpc_pods + tls_pods:
        p.stop()
    for q in quic_pods:
        q.close()
    print("demo:", "OK" if ok else "FAILED")
    return 0 if ok else 1


def _grpc_calls_h2c_then_tls(
    port: int, pki: DemoPki, out: list[str], rows: list[tuple[str, str, int, int]],
    tls_pods: list[Any], rewrite_endpoints: Callable[[str], None], app: Any,
) -> bool:
    """h2c pods first; then point the endpoints at the TLS pods (the file is re-read)."""
    import time

    ok = _grpc_calls_h2c(port, out)
    tls_rows = [(p, ip, t.port, q) for (p, ip, _g, q), t in zip(rows, tls_pods, strict=True)]
    rewrite_endpoints(endpoints_document(tls_rows))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        snap = app.snapshot()
        if all(snap.get(p) is not None and snap.get(p).grpc_port == t for p, _ip, t, _q in tls_rows):
            break
        time.sleep(0.05)
    ok &= _grpc_calls_tls(port, pki, out)
    return ok


def _grpc_calls_h2c(port: int, out: list[str]) -> bool:
    import grpc

    from router.demo.grpc_pods import call_whoami

    ok = True
    target = f"127.0.0.1:{port}"
    for pod, _ip in PODS:
        host = f"{pod}.stargate.external"
        with grpc.insecure_channel(target, options=[("grpc.default_authority", host)]) as ch:
            got = call_whoami(ch)
        out.append(f"  h2c  :authority {host:<30} -> answered by {got}")
        ok &= got == pod
    for host, expected in (
        ("stargate-9.stargate.external", grpc.StatusCode.UNAVAILABLE),
        ("example.com", grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with grpc.insecure_channel(target, options=[("grpc.default_authority", host)]) as ch:
            try:
                call_whoami(ch)
                out.append(f"  h2c  :authority {host:<30} -> unexpectedly routed")
                ok = False
            except grpc.RpcError as err:
                code = err.code()
                out.append(f"  h2c  :authority {host:<30} -> rejected {code.name}: {err.details()}")
                ok &= code == expected
    return ok


def _grpc_calls_tls(port: int, pki: DemoPki, out: list[str]) -> bool:
    import grpc

    from router.demo.grpc_pods import call_whoami

    ok = True
    target = f"127.0.0.1:{port}"
    creds = grpc.ssl_channel_credentials(root_certificates=pki.ca_pem)
    for pod, _ip in PODS:
        host = f"{pod}.stargate.external"
        with grpc.secure_channel(target, creds, options=[("grpc.ssl_target_name_override", host)]) as ch:
            got = call_whoami(ch)
        out.append(f"  tls  SNI        {host:<30} -> answered by {got}")
        ok &= got == pod
    return ok


def run_demo(argv: Sequence[str]) -> int:
    if argv:
        print("usage: stargate-router demo", file=sys.stderr)
        return 2
    with MemoryFiles() as files:
        return asyncio.run(_demo(files))

"""Stargate-like gRPC pods for the demo, the tests and the benchmarks.

Real grpcio servers with generic (protobuf-free) handlers that answer with their pod
name, so a caller can see which pod a routed call reached. Byte payloads, no codegen.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc

SERVICE = "stargate.StargateControlPlane"
WHOAMI = f"/{SERVICE}/WhoAmI"
"""Unary: returns the pod name."""
WATCH = f"/{SERVICE}/WatchStargates"
"""Server streaming: three messages naming the pod (the round-robin fallback path)."""
ECHO = f"/{SERVICE}/Echo"
"""Bidirectional streaming: echoes every message back, prefixed by nothing."""
REGISTER = f"/{SERVICE}/RegisterWorker"
"""Unary: echoes the request, prefixed by ``<pod>:``."""


def _identity(b: bytes) -> bytes:
    return b


class _PodHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, pod_name: str) -> None:
        self._pod = pod_name.encode()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        if method == WHOAMI:
            return grpc.unary_unary_rpc_method_handler(
                lambda req, ctx: self._pod, _identity, _identity
            )
        if method == REGISTER:
            return grpc.unary_unary_rpc_method_handler(
                lambda req, ctx: self._pod + b":" + req, _identity, _identity
            )
        if method == WATCH:
            return grpc.unary_stream_rpc_method_handler(self._watch, _identity, _identity)
        if method == ECHO:
            return grpc.stream_stream_rpc_method_handler(self._echo, _identity, _identity)
        return None

    def _watch(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        for i in range(3):
            yield self._pod + b":" + str(i).encode()

    def _echo(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        yield from requests


@dataclass
class RunningPod:
    pod_name: str
    address: str
    port: int
    server: grpc.Server

    def stop(self) -> None:
        self.server.stop(grace=None)


def start_pod(
    pod_name: str,
    address: str,
    port: int = 0,
    *,
    cert_pem: bytes | None = None,
    key_pem: bytes | None = None,
    max_workers: int = 16,
) -> RunningPod:
    """Start a grpcio server for ``pod_name`` on ``address:port`` (h2c, or TLS if a cert is given)."""
    from concurrent.futures import ThreadPoolExecutor

    server = grpc.server(
        ThreadPoolExecutor(max_workers=max_workers),
        options=[("grpc.so_reuseport", 0)],
    )
    server.add_generic_rpc_handlers((_PodHandler(pod_name),))
    bind = f"{address}:{port}"
    if cert_pem is not None and key_pem is not None:
        creds = grpc.ssl_server_credentials([(key_pem, cert_pem)])
        bound = server.add_secure_port(bind, creds)
    else:
        bound = server.add_insecure_port(bind)
    if bound == 0:
        raise OSError(f"could not bind gRPC pod {pod_name} on {bind}")
    server.start()
    return RunningPod(pod_name, address, bound, server)


def call_whoami(channel: grpc.Channel, timeout: float = 5.0) -> str:
    """Unary WhoAmI on ``channel``; returns the answering pod's name."""
    stub = channel.unary_unary(WHOAMI, request_serializer=_identity, response_deserializer=_identity)
    reply: bytes = stub(b"", timeout=timeout)
    return reply.decode()

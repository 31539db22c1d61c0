"""Sans-IO wire formats of the TCP edge: what the router reads from a connection's first bytes and
writes when it refuses one, without terminating TLS.

- ``tls``: the TLS record-layer peek (``ClientHelloReader``) and fatal alerts (``TlsAlert``);
- ``client_hello``: the bounded ClientHello walker (SNI, ALPN) that QUIC Initials share;
- ``h2_frames``, ``h2c``: the HTTP/2 preface and frame layout, and the first request's
  ``:authority`` of a prior-knowledge (h2c) stream;
- ``settings_ack``: the filter that hides the client's ACK of the router's own SETTINGS;
- ``grpc``: gRPC status codes (``GrpcStatus``) and the trailers-only rejection;
- ``proxy_protocol``: PROXY v1/v2 headers from a balancer.

Bytes in, facts (or bytes) out; each parser raises only its own error type and keeps its limits
beside it. Imports nothing from ``router``, ``quic`` or ``discovery`` (``tests/process/test_layering.py``).
"""

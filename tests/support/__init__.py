"""Code the tests share that is not a fixture: byte builders and harnesses (no tests here).

Builders: ``tls`` (ClientHellos and TLS records), ``h2`` (HTTP/2 frames, a real h2 client and
its gRPC request), ``quic_frames`` (CRYPTO, ACK, CONNECTION_CLOSE), ``quic_vectors`` (the RFC 9001 /
9369 example Initials), ``initial_packets`` (client Initials under the router's own packet protection),
``quic_initial_rewriter`` (a real client's first flight, rebuilt with aioquic's).
Harnesses: ``router_process`` (the router as a subprocess), ``udp_router`` (an in-process
QUIC edge on loopback), ``bulk_tls`` (a TLS pod and client for byte-exact bulk transfers),
``polling`` (every wait a test makes: ``eventually``, ``holds``, ``steady``, ``deliberate_pause``),
``haproxy`` (Debian's HAProxy in front of the router, sending PROXY headers), ``edge_clients``
(raw TCP and aioquic clients from a chosen loopback address);
``proxy_headers`` builds PROXY v1/v2 headers; ``names`` (``host(pod)``) spells the hostname a
pod is dialled by; ``access_peers`` (raw pods that end connections a chosen way, a byte-counting
client, the router's access lines). Fixtures live in ``tests/conftest.py``.
"""

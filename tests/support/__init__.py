"""Code the tests share that is not a fixture: byte builders and harnesses (no tests here).

``tls`` (ClientHellos and TLS records), ``h2`` (HTTP/2 frames), ``quic_initial_rewriter``
(client first flights, rebuilt), ``router_process`` (the router as a subprocess),
``bulk_tls`` (a TLS pod and client for byte-exact bulk transfers), ``polling``
(``eventually``) and ``udp_router`` (an in-process ``UdpRouter`` on loopback).
Fixtures live in ``tests/conftest.py``.
"""

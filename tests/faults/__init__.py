"""Fault suite: the router process against hostile clients, failing pods and a misbehaving API.

Loopback only (router on 127.0.0.1, pods on 127.0.0.2+), every loop bounded in count and
time. What the fault modules share lives beside them: ``router_probes`` (the router process
seen from outside: gRPC probes, ``/proc`` fds, RSS and CPU, scraped counters), ``tcp_peers``
(raw TCP pods and a bounded client read) and ``quic_flood`` (the Initial flood's forge,
sockets and audit). Hand-built ClientHellos come from ``tests.support.tls``.
"""

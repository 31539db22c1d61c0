"""Sans-IO wire formats of the TCP edge: what the router reads from a connection's first bytes and
writes when it refuses one, without terminating TLS (the modules: docs/architecture.md).

Bytes in, facts (or bytes) out; each parser raises only its own error type and keeps its limits
beside it. Imports nothing from ``router``, ``quic`` or ``discovery`` (``tests/process/test_layering.py``).
"""

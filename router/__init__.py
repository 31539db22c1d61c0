"""stargate-router, the process: an L4 router that splices each worker to the pod it names.

The top of this package is the process (flags, lifecycle and drain, workers, health, metrics, logging)
and ``routing``, the one pure routing decision both edges call; ``tcp/`` is the TCP edge, ``udp/`` the
QUIC edge, ``demo/`` the demo. Dependencies point down: ``quic`` and ``discovery`` never import ``router``.
"""

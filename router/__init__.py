"""stargate-router, the process: an L4 router that splices each worker to the pod it names.

The top of this package is the process itself: ``cli``/``config`` (flags), ``app`` (lifecycle,
SIGTERM drain), ``supervisor`` (``--workers N``), ``health`` (probes and ``/metrics``),
``metrics``/``outcomes`` (zero-initialised families and their label values), logging, ``hostname``
(template -> pod name), ``routing``, the one pure routing decision both edges call, and
``client_limits``, what each client IP holds against its per-client limit.
``tcp/`` is the TCP edge, ``udp/`` the QUIC edge, ``demo/`` the demo. Dependencies point down:
``router`` uses ``quic`` and ``discovery``; they never import ``router``.
"""

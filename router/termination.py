"""How a connection or flow ended: the ``termination`` of its access line and metric label.

A closed set, so dashboards can list every value and the metric exports each at 0. The
access log (``router/access_log.py``) and the termination counter both use it; the edges
pick the member from what they saw (which side sent FIN or RST first, which timer fired).
"""

from __future__ import annotations

from enum import StrEnum


class Termination(StrEnum):
    """Who ended a connection or flow, and how: the ``termination`` key and metric label."""

    CLIENT_CLOSE = "client_close"
    """The client finished first (FIN), or closed before naming a host; the pod then finished too."""
    CLIENT_RESET = "client_reset"
    """The client's socket failed: RST, or a write to it was refused (EPIPE/ECONNRESET)."""
    POD_CLOSE = "pod_close"
    """The pod finished first (FIN); the client then finished too."""
    POD_RESET = "pod_reset"
    """The pod's socket failed: RST, or a write to it was refused."""
    IDLE_TIMEOUT = "idle_timeout"
    """Nothing moved either way for ``--relay-idle-timeout-ms`` (a QUIC flow's normal end)."""
    DRAIN = "drain"
    """Still open when the drain after SIGTERM ran out (``--drain-timeout-ms``): cut."""
    DIAL_FAILED = "dial_failed"
    """The pod was chosen but could not be reached (refused, timed out, no socket)."""
    PEEK_TIMEOUT = "peek_timeout"
    """The client did not present a hostname within ``--peek-timeout-ms``."""
    REJECTED = "rejected"
    """Refused before any pod was dialled: no, unknown or unroutable hostname, or unparsable bytes."""
    FLOW_TAKEOVER = "flow_takeover"
    """A QUIC flow whose client address a new connection (to another pod) took over."""
    ROUTER_ERROR = "router_error"
    """The router failed on its side (an OS error that is no peer's reset, or a bug)."""

"""Discovery's own tunables and limits, each with the reason it has that value.

Here so ``discovery/`` imports nothing from ``router/``; CLI defaults (service and port names, the
watch idle timeout) stay in ``router/constants.py`` and are passed down.
"""

from __future__ import annotations

from typing import Final

SERVICE_NAME_LABEL: Final = "kubernetes.io/service-name"
"""Label the EndpointSlice controller puts on every slice of a Service."""

WATCH_TIMEOUT_S: Final = 300
"""Server-side watch timeout; the API server ends the stream and we re-watch from the last RV."""

WATCH_READ_SLACK_S: Final = 30.0
"""A watch stream silent for WATCH_TIMEOUT_S plus this is dead (the server's own timeout fires first)."""

WATCH_HEALTHY_AFTER_S: Final = 5.0
"""An event-less watch open this long resets the backoff; shorter ones back off, so never a hot loop."""

BACKOFF_INITIAL_S: Final = 0.5
"""First retry delay after an API error."""

BACKOFF_MAX_S: Final = 30.0
"""Retry delay cap: an API outage is retried at least twice a minute."""

RECONNECT_BACKOFF_MAX_S: Final = 0.8
"""Retry cap after a connection failure (refused dial, dropped stream): a refused dial costs the server
nothing, and re-dialling this often finds it within a second of its return. Error answers back off to BACKOFF_MAX_S."""

RETRY_AFTER_JITTER: Final = 0.1
"""A Retry-After wait is stretched by up to this fraction, so many routers do not return in lockstep."""

RETRY_AFTER_MIN_S: Final = 0.1
"""Floor of a Retry-After wait: ``Retry-After: 0`` repeated never becomes a hot loop."""

KUBE_API_CONNECT_TIMEOUT_S: Final = 10.0
"""Connect timeout to the API server; a blackholed server fails here and is retried with backoff."""

KUBE_LIST_TIMEOUT_S: Final = 60.0
"""Whole-request cap on one EndpointSlice list; a loaded API server answers big lists in seconds."""

TCP_KEEPALIVE_IDLE_S: Final = 30
"""Idle seconds before the first keepalive probe on an API connection (client-go dials with 30 s)."""

TCP_KEEPALIVE_INTERVAL_S: Final = 10
"""Seconds between keepalive probes: a dead peer is found about a minute after it went silent."""

TCP_KEEPALIVE_PROBES: Final = 3
"""Unanswered probes before the kernel resets the connection and the watch fails over."""

ENDPOINTS_FILE_MAX_BYTES: Final = 32 * 1024 * 1024
"""Larger endpoints files are refused unread; a 10,000-pod EndpointSlice dump is about 10 MiB."""

ENDPOINTS_FILE_POLL_INTERVAL_S: Final = 0.5
"""The endpoints file is re-checked twice a second (the contract is at least once a second)."""

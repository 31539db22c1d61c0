"""Discovery's own tunables and limits, each with the reason it has that value.

Defined here, beside the code that uses them, so ``discovery/`` imports nothing from
``router/``. CLI defaults (service and port names) stay in
``router/constants.py``: the router passes them down explicitly.
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

KUBE_API_CONNECT_TIMEOUT_S: Final = 10.0
"""Connect timeout to the API server; a blackholed server fails here and is retried with backoff."""

KUBE_LIST_TIMEOUT_S: Final = 60.0
"""Whole-request cap on one EndpointSlice list; a loaded API server answers big lists in seconds."""

ENDPOINTS_FILE_MAX_BYTES: Final = 32 * 1024 * 1024
"""Larger endpoints files are refused unread; a 10,000-pod EndpointSlice dump is about 10 MiB."""

ENDPOINTS_FILE_POLL_INTERVAL_S: Final = 0.5
"""The endpoints file is re-checked twice a second (the contract is at least once a second)."""

"""The router's own pinned values: its tunables, CLI defaults and metric names, each with its reason.

CLI defaults and metric names match the Rust ``stargate-k8s-router``: a drop-in replacement whose
dashboards keep working. A parser's limits live beside that parser (``wire/``, ``quic/``), protocol
codes as enums in their codec. It imports nothing from the project, and ``wire/``, ``quic/`` and
``discovery/`` must not import anything in ``router/`` (``tests/process/test_layering.py``)."""

from __future__ import annotations

from typing import Final

# -- CLI defaults (same names and values as the Rust router's flags) ----------
DEFAULT_LISTEN_ADDR: Final = "0.0.0.0:50071"
"""Worker gRPC (h2c or TLS) port the Gateway TCPRoute sends to; the Rust router's default."""
DEFAULT_REVERSE_TUNNEL_LISTEN_ADDR: Final = "0.0.0.0:50072"
"""Worker QUIC reverse-tunnel port the Gateway UDPRoute sends to; the Rust router's default."""
DEFAULT_HEALTH_LISTEN_ADDR: Final = "0.0.0.0:8080"
"""Probes and Prometheus scrape port; the Rust router's default."""
TARGET_NAMESPACE_ENV: Final = "POD_NAMESPACE"
"""Downward-API variable the Deployment sets; used when --target-namespace is absent."""
DEFAULT_TARGET_SERVICE_NAME: Final = "stargate-headless"
"""Headless Service of the Stargate StatefulSet whose EndpointSlices list the pods."""
DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE: Final = "{pod_name}.stargate.external"
"""Hostname a worker puts in :authority / SNI; Stargate advertises the same template."""
DEFAULT_GRPC_PORT_NAME: Final = "grpc"
"""Named TCP port of the Stargate pod in its EndpointSlices."""
DEFAULT_QUIC_PORT_NAME: Final = "quic"
"""Named UDP port of the Stargate pod in its EndpointSlices."""
DEFAULT_CONNECT_TIMEOUT_MS: Final = 5_000
"""Dial timeout to a pod: long enough for a loaded node, short enough for a retrying worker."""
DEFAULT_RELAY_IDLE_TIMEOUT_MS: Final = 300_000
"""A spliced connection or UDP flow idle this long is closed (gRPC keepalives are shorter)."""
DEFAULT_PEEK_TIMEOUT_MS: Final = 5_000
"""Time a client has to present its hostname; bounds what a slowloris can hold."""
DEFAULT_ROUND_ROBIN_PATHS: Final = ("/stargate.StargateControlPlane/WatchStargates",)
"""h2c paths that may go to any ready pod when the authority names none (Rust router behaviour)."""
DEFAULT_SHUTDOWN_DELAY_MS: Final = 5_000
"""After SIGTERM, keep accepting this long so the Gateway sees /readyz 503 and stops sending."""
DEFAULT_DRAIN_TIMEOUT_MS: Final = 30_000
"""After the listeners close, established flows get this long to finish before being cut."""
DEFAULT_LOG_FORMAT: Final = "text"
"""Human-readable by default; ``json`` for log pipelines."""
DEFAULT_LOG_LEVEL: Final = "info"
"""Rejections are logged at info, routing decisions at debug."""
LOG_LEVEL_ENV: Final = "LOG_LEVEL"
"""Environment variable that sets the log level when --log-level is absent."""
DEFAULT_WORKERS: Final = 1
"""Processes sharing the listeners with SO_REUSEPORT; one is enough for most Gateways."""
DEFAULT_KUBE_WATCH_IDLE_TIMEOUT_MS: Final = 180_000
"""Three bookmark periods (the API server bookmarks a watch about once a minute): two lost
bookmarks are tolerated, and a silent stream is replaced within 3 min, not 5.5 (the read timeout)."""
MIN_KUBE_WATCH_IDLE_TIMEOUT_MS: Final = 100
"""Below this the watchdog would re-open a quiet watch in a near-hot loop."""
DEFAULT_ACCEPT_PROXY_PROTOCOL: Final = False
"""PROXY protocol off: a router reached without a balancer in front would otherwise refuse every worker."""
DEFAULT_PROXY_PROTOCOL_TRUSTED_CIDRS: Final = ()
"""No source may send a PROXY header until the flag names the balancer's (nginx's ``set_real_ip_from``):
a header believed from any pod lets that pod claim any client address."""
DEFAULT_TCP_DEFER_ACCEPT: Final = "on"
"""Accept once the first bytes came (every protocol here speaks first): no wait, task or second
read per connection (9% of its CPU on the bench), nothing held for a silent client."""
DEFAULT_MAX_CONNECTIONS_PER_CLIENT: Final = 0
"""No per-client TCP limit (the Rust router has none): one NAT egress may carry many real workers."""
DEFAULT_MAX_QUIC_FLOWS_PER_CLIENT: Final = 0
"""No per-client QUIC limit, as for TCP connections."""
MAX_PER_CLIENT_LIMIT: Final = 1_000_000
"""Largest per-client limit accepted: more than any fd limit, so a larger value is a typo."""

# -- The Rust router's flags for its tunnels and certificates (router/inert_flags.py) --
TUNNEL_PROTOCOLS: Final = ("raw-quic", "webtransport")
"""``--tunnel-protocol`` values, the Rust router's: both arrive as QUIC and route by the Initial's SNI."""
DEFAULT_TUNNEL_PROTOCOL: Final = "raw-quic"
"""The Rust router's default: the QUIC listener's flows count in ``quic_connections_total``."""
WEBTRANSPORT: Final = "webtransport"
"""The ``--tunnel-protocol`` under which they count in ``webtransport_sessions_total`` instead."""
DEFAULT_RELAY_KEEP_ALIVE_MS: Final = 10_000
"""The Rust router's default (0 disables); no effect here: PINGs travel inside encrypted QUIC,
so the tunnel's endpoints keep it alive (docs/coming-from-rust.md)."""
TLS_CERT_PATH_ENV: Final = "STARGATE_TLS_CERT_PATH"
"""Env of ``--tls-cert-path`` (the Rust router's); accepted, unused: TLS and QUIC end at the pod."""
TLS_KEY_PATH_ENV: Final = "STARGATE_TLS_KEY_PATH"
"""Env of ``--tls-key-path`` (the Rust router's); accepted, unused: the router holds no key."""
QUIC_INSECURE_ENV: Final = "STARGATE_QUIC_INSECURE"
"""Env of ``--quic-insecure`` (the Rust router's); accepted, unused: the router verifies no peer."""
UPSTREAM_TLS_CERT_PATH_ENV: Final = "STARGATE_UPSTREAM_TLS_CERT_PATH"
"""Env of ``--upstream-tls-cert-path`` (the Rust router's, webtransport only); accepted, unused:
the router opens no TLS to the pod, the worker's session reaches it."""

# -- Hostnames ------------------------------------------------------------------
MAX_HOSTNAME_LENGTH: Final = 253
"""Longest DNS name (RFC 1035); longer :authority / SNI values never route."""
MAX_PORT: Final = 65_535
"""The largest TCP or UDP port: a target port outside 1..MAX_PORT cannot be dialled (the pod counts as not
ready), a flag's port outside 0..MAX_PORT is refused."""
MAX_PORT_DIGITS: Final = len(str(MAX_PORT))
"""Digits of a ``:port`` after the name; a longer port never routes."""
MAX_AUTHORITY_LENGTH: Final = MAX_HOSTNAME_LENGTH + len(".") + len(":") + MAX_PORT_DIGITS
"""The longest :authority / SNI that may name a pod (260: the name, its trailing dot, the port): a longer
one is refused as an unknown name before the template, or its table of names, looks at it."""
HOSTNAME_CACHE_ENTRIES: Final = 4096
"""Hostnames whose pod name the template remembers (workers name the same pods again and again;
the match is a regex). Only names of a pod are kept and the table is emptied when full: at most 4,096
names of MAX_AUTHORITY_LENGTH characters with their pod names, <= ~2 MiB (1.8 MiB measured)."""
MAX_POD_NAME_LENGTH: Final = 63
"""A pod name extracted from a hostname must be one DNS-1123 label."""

# -- Relay (TCP: copied through a shared buffer, then spliced) ----------------
RELAY_CHUNK_BYTES: Final = 256 * 1024
"""Read size per recv on the buffered relay path; large enough to amortise syscalls."""
SPLICE_PIPE_BYTES: Final = 1024 * 1024
"""Pipe size for os.splice zero-copy relaying (F_SETPIPE_SZ); clipped by /proc limits."""
SPLICE_AFTER_BYTES: Final = 64 * 1024
"""A direction is copied through one shared buffer until it has carried this much; only bulk
flows pay for a pipe (pipe2 + 2 fcntl + 2 close, 2 fds), short gRPC exchanges never do."""
RELAY_REPORT_BYTES: Final = 1024 * 1024
"""on_bytes is called after this many bytes per direction (and at close): metrics stay cheap."""
RELAY_RELEASE_QUIET_S: Final = 1.0
"""A relay direction quiet this long gives back its pipe/buffer: idle connections hold ~no memory."""
RELAY_ROUNDS_PER_WAKEUP: Final = 8
"""Read/write rounds one readiness callback may do before yielding to other connections."""
GC_YOUNG_THRESHOLD: Final = 20_000
"""Allocations between young-generation GC passes (CPython's default: 700). A connection leaves
no cyclic garbage, so each pass only re-scans the objects of the connections in flight."""
RELAY_TIMER_DEFER_S: Final = 0.25
"""A relay's idle timer is armed this long after it starts, by one shared callback: shorter connections
never create one; deadlines are absolute, so it fires on time (a shorter idle timeout is armed at once)."""

# -- QUIC / UDP edge (router/udp/): flow table, joins, the workers' index, refusals, sockets --
QUIC_MAX_PENDING_DATAGRAMS_PER_FLOW: Final = 16
"""Datagrams held for a flow whose SNI is not complete yet (big ClientHellos need 2-4)."""
QUIC_MAX_PENDING_BYTES_PER_FLOW: Final = 32 * 1024
"""Bytes held for one pending flow; bounds memory per spoofed source address."""
QUIC_MAX_PENDING_FLOWS: Final = 4_096
"""Pending (not yet routed) flows at once; beyond this new Initials are dropped and counted."""
QUIC_MAX_PENDING_FLOWS_PER_ADDRESS: Final = 1
"""Connections one client address may have half-read at once: a usual hello is routed on arrival, so
a second one waits at most a retransmit, and one address's flood costs what it did before."""
QUIC_PENDING_FLOW_TIMEOUT_MS: Final = 3_000
"""A pending flow whose ClientHello is still incomplete after this is dropped."""
QUIC_MAX_FLOWS: Final = 65_536
"""Established UDP flows at once; each holds one connected socket (file descriptor)."""
DEFAULT_QUIC_HANDSHAKE_TIMEOUT_MS: Final = 10_000
"""``--quic-handshake-timeout-ms``: a routed flow not confirmed by then (its client never sent a 1-RTT
packet to the pod's connection ID, or the pod never answered) is ended. A handshake takes 1-2 round
trips plus a few PTOs of loss recovery: seconds on the worst path, as Envoy's QUIC handshake timeout
and HAProxy's are. A forged Initial holds a socket this long, not its claimed idle timeout."""
QUIC_MAX_LEARNED_CIDS_PER_FLOW: Final = 16
"""Pod connection IDs remembered per flow for migration (aioquic issues up to 8)."""
QUIC_FLOW_SWEEP_INTERVAL_MS: Final = 500
"""How often pending deadlines, idle flows and batched byte counters are swept/flushed."""
QUIC_IDLE_PROBE_TIMEOUT_MS: Final = 1_000
"""The PTO a flow's idle expiry allows three of (RFC 9000 10.1): RFC 9002 6.2.2's before any RTT sample
(333 ms + 4 x 166.5 ms + max_ack_delay 25 ms ~ 1 s), above a PTO's srtt + 4 rttvar on paths under ~500 ms."""
QUIC_IDLE_GRACE_MS: Final = 1_000
"""Added to a flow's idle expiry: the sweep's lateness and a close's last datagrams in flight."""

DEFAULT_QUIC_LB_SERVER_ID_BYTES: Final = 0
"""``--quic-lb-server-id-bytes``: off. Pods must issue QUIC-LB connection IDs for it to mean anything."""
QUIC_LB_JOINS_PER_S: Final = 500.0
"""Flows one worker may open per second for datagrams routed by server ID (a token bucket): a
replica's rollout moves its tunnels to the others at this pace at least; a flood of datagrams naming
a pod costs at most this many sockets a second (each datagram is retransmitted, so a refused join
is tried again)."""
QUIC_LB_JOIN_BURST: Final = 1_000.0
"""The bucket's depth: a rolled-out replica's thousand tunnels join another at once."""

QUIC_CID_INDEX_ENTRIES_PER_WORKER: Final = 32_768
"""Pod connection IDs one worker shares (48 bytes each: 1.5 MiB, paged in as written): two per flow of a
busy worker's usual load; beyond it the index forgets the oldest hint in a window, not a flow."""
QUIC_CID_INDEX_WINDOW: Final = 8
"""Entries a connection ID may sit in from its hash: a lookup reads at most this many per worker."""

QUIC_REJECT_BUDGET_BYTES_PER_S: Final = 1_000_000
"""Global byte rate of CONNECTION_CLOSE answers; with the <= received-bytes rule, no amplifier."""
QUIC_REJECTION_MEMORY_MS: Final = 10_000
"""A refused attempt (address + DCID) is remembered this long, past a client's first PTO backoffs."""
QUIC_MAX_REMEMBERED_REJECTIONS: Final = 4_096
"""Refused attempts remembered at once (oldest forgotten first); bounds a spoofed-source flood."""
QUIC_ANSWERS_PER_REJECTION: Final = 3
"""CONNECTION_CLOSE answers per refused attempt: the first plus two for lost ones, then silence."""
QUIC_DATAGRAM_ERROR_LOG_LINES_PER_S: Final = 1.0
"""Tracebacks a second of a bug a client datagram met (it costs that datagram only): one names the
bug, the rest are counted as suppressed, so a flood of such datagrams is no flood of tracebacks."""

QUIC_SOCKET_BUFFER_BYTES: Final = 4 * 1024 * 1024
"""QUIC listener SO_RCVBUF/SO_SNDBUF: a burst of a few hundred Initials overflowed the default
(the kernel clamps it to net.core.rmem_max / wmem_max)."""
QUIC_MAX_UDP_PAYLOAD_BYTES: Final = 65_535
"""Room every pod read gets: no UDP payload or GRO batch is longer, so nothing is truncated."""
QUIC_POD_RECEIVE_BUFFER_BYTES: Final = 256 * 1024
"""The router's one pod-read buffer: reads land back to back so a burst leaves as one GSO send;
four maximal reads fit before it wraps (after sending what it holds)."""
QUIC_POD_READS_PER_CALLBACK: Final = 64
"""Reads of one flow's pod socket per readiness callback: one full GSO run of single datagrams,
and a bound (about 64 syscalls) so one busy flow cannot starve the others."""
QUIC_GSO_MAX_SEGMENTS: Final = 64
"""Datagrams in one ``UDP_SEGMENT`` send: the kernel's UDP_MAX_SEGMENTS before Linux 6.x (newer allow 128)."""
QUIC_GSO_MAX_BYTES: Final = 65_507
"""Payload of one ``UDP_SEGMENT`` send: the largest IPv4 UDP payload (IPv6 allows 20 bytes more)."""
QUIC_OUTBOX_DATAGRAMS: Final = QUIC_GSO_MAX_SEGMENTS
"""Client datagrams a flow collects within one loop iteration before it sends them at once: one
full GSO run, so a flood holds at most this many per flow between two sends."""
QUIC_SPLICE_BATCHES_PER_CALLBACK: Final = 4
"""``recvmmsg`` calls of 64 reads (a GRO read glues several datagrams) per readiness of the public
socket, fewer once 256 datagrams wait for Python: a flood still yields the loop to timers and pods."""
NO_EXTENSIONS_ENV: Final = "STARGATE_ROUTER_NO_EXTENSIONS"
"""Set (to anything but empty) to run the pure-Python path although the C splice is built: the
tests run both, and an operator can rule the extension out (the name follows aiohttp's and yarl's)."""
NO_IO_URING_ENV: Final = "STARGATE_ROUTER_NO_IO_URING"
"""Set (to anything but empty) to keep the C splice's sends to pods on one ``sendmmsg`` per flow
where the kernel would take a batch's, for all flows, in one ``io_uring_enter`` (``_send_ring.h``)."""
QUIC_POD_SOCKADDR_CACHE: Final = 4_096
"""Pod endpoints whose resolved socket address is kept, so a new flow skips ``getaddrinfo``: far
more than one router's pods, and bounded (least recently used first out) when endpoints churn."""

# -- Memory: the QUIC tables' bounds sized to the container's limit (router/memory_bounds.py)
CGROUP_MEMORY_MAX_PATH: Final = "/sys/fs/cgroup/memory.max"
"""cgroup v2's memory limit of the container (its own cgroup under a cgroup namespace, as in Kubernetes)."""
CGROUP_MEMORY_MAX_PATH_ENV: Final = "STARGATE_ROUTER_CGROUP_MEMORY_MAX"
"""A ``memory.max`` file to read instead of ``CGROUP_MEMORY_MAX_PATH`` (tests; a cgroup mounted elsewhere)."""
MEMORY_BASELINE_BYTES: Final = 64 * 1024 * 1024
"""The router's RSS before any flow (52-55 MiB measured: interpreter, modules, C extensions,
metric families), rounded up: no flow may count on it."""
MEMORY_USABLE_FRACTION: Final = 0.75
"""Share of the limit the QUIC tables' worst case plus the baseline may take; the rest is for TCP
connections and the kernel's socket buffers, which the same cgroup is charged for."""
MEMORY_PENDING_SHARE: Final = 1 / 3
"""Of what is usable above the baseline, the part for pending flows (a flood fills them; a real
client holds one for a round trip); the rest for established flows (workers' tunnels)."""
QUIC_PENDING_FLOW_OVERHEAD_BYTES: Final = 4 * 1024
"""A pending flow's objects beyond its held datagrams and CRYPTO reassembly (the sniffer, its
lists, the table's entries); with them a full pending flow costs ~52 KiB."""
QUIC_FLOW_WORST_BYTES: Final = 8 * 1024
"""An established flow: 3.1 KiB of router memory measured (bench/README, access record and live
view included) plus the kernel's socket, file and epoll entry, doubled for slack."""
MIN_QUIC_PENDING_FLOWS: Final = 64
"""However small the limit, this many handshakes may be in flight (a real one takes a round trip)."""
MIN_QUIC_FLOWS: Final = 256
"""However small the limit, this many tunnels may be established."""

# -- Metrics (names and label values match the Rust router) -------------------
METRIC_PREFIX: Final = "stargate_k8s_router"
"""Prefix of every series, as exported by the Rust router."""
GRPC_CONNECTIONS_TOTAL: Final = f"{METRIC_PREFIX}_grpc_connections"
"""Counter (``_total`` added by prometheus-client) of TCP connections by protocol and outcome."""
QUIC_CONNECTIONS_TOTAL: Final = f"{METRIC_PREFIX}_quic_connections"
"""Counter of QUIC flows by outcome (``--tunnel-protocol raw-quic``; all at 0 under webtransport)."""
WEBTRANSPORT_SESSIONS_TOTAL: Final = f"{METRIC_PREFIX}_webtransport_sessions"
"""Counter of the QUIC listener's flows by outcome under ``--tunnel-protocol webtransport`` (all at 0
under raw-quic): the Rust router's family, which dashboards built on it read."""
RELAYED_BYTES_TOTAL: Final = f"{METRIC_PREFIX}_relayed_bytes"
"""Counter of bytes spliced, by protocol (h2c, tls, quic) and direction."""
ACTIVE_CONNECTIONS: Final = f"{METRIC_PREFIX}_active_connections"
"""Gauge of spliced TCP connections / UDP flows now open, by protocol."""
PENDING_FLOWS: Final = f"{METRIC_PREFIX}_quic_pending_flows"
"""Gauge of UDP flows still waiting for a complete ClientHello."""
QUIC_DROPPED_DATAGRAMS_TOTAL: Final = f"{METRIC_PREFIX}_quic_dropped_datagrams"
"""Counter of datagrams dropped without routing, by reason."""
READY_TARGETS: Final = f"{METRIC_PREFIX}_ready_targets"
"""Gauge of pods in the current snapshot."""
DECISION_LATENCY_SECONDS: Final = f"{METRIC_PREFIX}_decision_latency_seconds"
"""Histogram of first byte to routing decision, by protocol."""
DIAL_LATENCY_SECONDS: Final = f"{METRIC_PREFIX}_dial_latency_seconds"
"""Histogram of pod dial time, by protocol."""
WORKER_RESTARTS_TOTAL: Final = f"{METRIC_PREFIX}_worker_restarts"
"""Counter (``_total`` added by prometheus-client) of dead worker processes the supervisor restarted."""
DISCOVERY_UPDATES_TOTAL: Final = f"{METRIC_PREFIX}_discovery_updates"
"""Counter of snapshots published, by source and result."""
DISCOVERY_LAST_SYNC_AGE_SECONDS: Final = f"{METRIC_PREFIX}_discovery_last_sync_age_seconds"
"""Gauge of seconds since the discovery source last synced successfully."""
DISCOVERY_REWATCHES_TOTAL: Final = f"{METRIC_PREFIX}_discovery_rewatches"
"""Counter of Kubernetes watches re-opened, by cause (idle, ended, dropped, expired)."""
BUILD_INFO: Final = f"{METRIC_PREFIX}_build_info"
"""Constant 1 gauge labelled with the version."""
LATENCY_BUCKETS_S: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)
"""Histogram buckets from 100 µs (loopback dial) to 5 s (the default timeouts)."""

# -- Rejection wording (the Rust router's reason phrases, reused for gRPC and QUIC)
REASON_MISSING_SNI: Final = "missing target SNI"
"""QUIC CONNECTION_CLOSE reason when the ClientHello has no server_name."""
REASON_UNKNOWN_SNI: Final = "unknown target SNI"
"""QUIC CONNECTION_CLOSE reason when the SNI names no pod of the snapshot."""
REASON_TARGET_NOT_READY: Final = "target stargate not ready"
"""Reason when the named pod is known by name but not routable (no port / dial failed)."""
REASON_TOO_MANY_CONNECTIONS: Final = "too many connections from client"
"""Reason (QUIC CONNECTION_CLOSE phrase, gRPC message) when a client is over its per-client limit."""

# -- Worker processes (--workers N) and the merge of their metrics ------------
WORKER_SEAT_ENV: Final = "STARGATE_ROUTER_WORKER_SEAT"
"""Set by the supervisor in each worker: its index and the descriptors passed to it (``router.worker_seat``)."""
MAX_WORKERS: Final = 64
"""``--workers`` at most: more processes than a pod's cores only add scheduling and memory."""
WORKER_REPORT_MAX_BYTES: Final = 4096
"""A worker's control line (bound, or a configuration error's one line) is cut at this length."""
CLIENT_TABLE_CAPACITY: Final = 65_536
"""Clients holding slots the shared table counts at once, per limit: (16 + 4 x workers) bytes each."""
CLIENT_TABLE_PROBE_WINDOW: Final = 64
"""Entries an admission reads from a client's hash: bounds the work done under the table's lock."""
WORKER_HEALTH_HOST: Final = "127.0.0.1"
"""Children serve /readyz and /metrics on a private loopback port only the supervisor reads."""
WORKER_RESTART_BACKOFF_INITIAL_S: Final = 0.5
"""First delay before restarting a dead worker: quick enough that capacity returns at once."""
WORKER_RESTART_BACKOFF_MAX_S: Final = 10.0
"""Restart delay cap: a crash-looping worker costs a fork every 10 s, not a hot loop."""
WORKER_STABLE_AFTER_S: Final = 10.0
"""A worker that lived this long died of something new: its next restart starts from the initial delay."""
WORKER_PROBE_TIMEOUT_S: Final = 2.0
"""Per-child /readyz and /metrics fetch timeout; well under a kubelet probe's and a scrape's 10 s."""
WORKER_MAX_RESPONSE_BYTES: Final = 8 * 1024 * 1024
"""A child's /metrics is ~40 KiB; a larger answer is a bug and is refused, not buffered."""
WORKER_STOP_GRACE_S: Final = 10.0
"""After SIGTERM a child gets shutdown delay + drain timeout + this before SIGKILL."""
WORKER_LOG_LINE_MAX_BYTES: Final = 1024 * 1024
"""A child's stderr line longer than this is passed on in pieces rather than buffered whole."""
PER_PROCESS_IDENTICAL_GAUGES: Final = frozenset({READY_TARGETS, DISCOVERY_LAST_SYNC_AGE_SECONDS, BUILD_INFO})
"""Gauges every worker reports about the same thing: merged with max, not summed (2 workers != 2x pods)."""
OLDEST_WINS_GAUGES: Final = frozenset({"process_start_time_seconds"})
"""Merged with min: the merged router started when its oldest process did (supervisor's, like ``_created``)."""
PER_PROCESS_LIMIT_GAUGES: Final = frozenset({"process_max_fds"})
"""Merged with max: every process has the same limit, so a sum would invent one no process has."""

# -- TCP accept and rejection -------------------------------------------------
ACCEPT_PAUSE_ON_EXHAUSTION_MS: Final = 100
"""accept() failing with EMFILE/ENFILE pauses the listener this long: no spin, resumes within 0.1 s."""
TCP_DEFER_ACCEPT_S: Final = 1
"""A silent client is accepted anyway after this long (then has the peek timeout); the kernel's finest step."""
ACCEPT_BATCH: Final = 64
"""Connections accepted per readiness callback; bounds one callback's latency under a burst."""
REJECT_LINGER_S: Final = 1.0
"""After a rejection, read (and discard) this long so the client reads our answer, not a RST."""
REJECTION_LOG_LINES_PER_S: Final = 20.0
"""Rejection log lines per second per listener; the rest are counted and reported as suppressed."""
LOG_FIELD_MAX_CHARS: Final = 300
"""A client's text in a log line (the ``hostname`` of an access line or a rejection, a refusal's detail) or
in a gRPC rejection message is cut to this many characters and marked: every legal authority (260) fits
whole, and a line stays small however long the name was (its escapes aside: at most 6 bytes a character)."""
LOG_MESSAGE_MAX_CHARS: Final = 2048
"""A log message longer than this is cut and marked, whatever put it there (tracebacks are no message:
never cut); the router's own are under 300 characters."""

# -- Health / metrics HTTP endpoint -------------------------------------------
HEALTH_MAX_REQUEST_HEAD_BYTES: Final = 8 * 1024
"""Probe and scrape requests are a few hundred bytes; anything larger is refused."""
HEALTH_REQUEST_TIMEOUT_S: Final = 5.0
"""A probe client that cannot send its request (or read the answer) in this long is cut off."""
PROBE_ERROR_LOG_LINES_PER_S: Final = 1.0
"""A route that fails (a bug) logs its traceback at most once a second; a client repeating the
request cannot flood the log, and the next line counts the ones left out."""

# -- Access log and the live view (operators' view of each connection and flow)
DEFAULT_ACCESS_LOG: Final = "on"
"""One line per connection and flow at info: "what happened to this worker's connection?" needs it."""
ACCESS_LOG_LINES_PER_S: Final = 1_000.0
"""Access lines of accepted connections one process writes per second, and at once (the bucket's depth): a
rollout's thousand tunnels ending together are all written; a flood writes at most ~1 MB/s of them, the
rest counted in ``log_lines_dropped_total{log="access"}`` (lines of rejected ones share the rejection rate)."""
LOG_LINES_DROPPED_TOTAL: Final = f"{METRIC_PREFIX}_log_lines_dropped"
"""Counter (``_total`` added by prometheus-client) of log lines a budget held back, by log (``access``,
``rejection``); the events themselves are counted in their own families all the same."""
ACCESS_LOGGER_NAME: Final = "router.access"
"""Logger of the access lines; pinned, so a pipeline can route or drop them by name."""
TERMINATIONS_TOTAL: Final = f"{METRIC_PREFIX}_terminations"
"""Counter (``_total`` added by prometheus-client) of ended connections and flows, by protocol
and termination (who ended it and how)."""
CONNECTION_DURATION_SECONDS: Final = f"{METRIC_PREFIX}_connection_duration_seconds"
"""Histogram of accept (or first datagram) to end of a connection or flow, by protocol."""
DURATION_BUCKETS_S: Final = (
    0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0,
)
"""From a refused connection (ms) to a day-long reverse tunnel; the idle timeout (300 s) is a bucket edge."""
LIVE_VIEW_MAX_ENTRIES: Final = QUIC_MAX_FLOWS + QUIC_MAX_PENDING_FLOWS + 65_536
"""Connections and flows the live view tracks at once (every QUIC flow and pending flow, and as many
TCP connections as a process has fds for); beyond it they are counted in ``total`` but not listed."""

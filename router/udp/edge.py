"""The QUIC reverse-tunnel edge: one UDP listener, one connected UDP socket per routed flow.

The router never terminates QUIC. A new client address is buffered (bounded) while its
Initial datagrams are decrypted for the SNI; then ``router.routing`` picks the pod, a connected
socket to its ``quic`` port is opened, the buffered datagrams are sent in arrival order, and
from then on datagrams are spliced both ways. Pod replies leave through the listener
(``listener``), so workers only ever see the router's address, and the pod sees one stable
peer (the flow's socket) even when the worker's NAT rebinds. Both directions are batched with
UDP GSO/GRO where the kernel offers them: client datagrams of one loop iteration leave per
flow in one send (``pod_link``), pod replies read back to back leave in one send
(``pod_to_client``). All bookkeeping is in the sans-IO ``UdpFlowTable`` and the verdicts of
``verdicts``; this module adapts sockets, the clock and metrics. How flows and attempts end
(socket closed, access line, client slot, outcome, the sweep's expiries) is ``flow_endings``,
the router's base class.

Which flow a client datagram belongs to is ``demux`` (a base class): several connections may
share one client address, told apart by their connection IDs as QUIC does. Refusals
(missing/unknown SNI, pod not ready, draining) are answered with an Initial CONNECTION_CLOSE so
the worker fails fast, and an unknown version with a Version Negotiation, under the rules of
``refusals``. A client IP holding ``--max-quic-flows-per-client`` pending and routed flows is
refused (``Refusal.CLIENT_LIMIT``). A flow silent longer than its connection's own idle timeout
(from the client's ``max_idle_timeout``) is ended by the sweep (``flow_endings``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from discovery.targets import Target, TargetSnapshot
from quic.initial_sniffer import InitialSniffer
from router import constants as c
from router.access_log import AccessLog
from router.client_limits import ClientSlots
from router.hostname import HostnameTemplate
from router.log_limiter import RateLimitedLog
from router.metrics import ProtocolSeries, RouterMetrics
from router.outcomes import ProtocolLabel, QuicOutcome, Termination
from router.routing import Refusal, Refused, route
from router.udp import native
from router.udp.demux import ClientDemux
from router.udp.flow_access import FlowAccess
from router.udp.flow_endings import Link
from router.udp.flow_table import Address, Flow, PendingFlow, UdpFlowTable
from router.udp.listener import SocketOut, open_listener, open_socket
from router.udp.pod_link import Outboxes, PodLink, connect_udp
from router.udp.pod_to_client import ClientReplies
from router.udp.refusals import QuicRefusals, peer
from router.udp.settings import UdpRouterSettings
from wire.client_hello import ClientHelloInfo

if TYPE_CHECKING:
    from router.udp._splice import Splicer

log = logging.getLogger("router.udp_router")  # pinned: operators filter logs by this name

PROTOCOL = ProtocolLabel.QUIC


class UdpRouter(ClientDemux):
    """Routes QUIC flows by ClientHello SNI to the named pod and splices their datagrams."""

    def __init__(
        self,
        settings: UdpRouterSettings,
        template: HostnameTemplate,
        snapshot: Callable[[], TargetSnapshot],
        metrics: RouterMetrics,
        access: AccessLog | None = None,
    ) -> None:
        self.settings = settings
        self._access = FlowAccess(access if access is not None else AccessLog(metrics))
        self._template = template
        self._snapshot = snapshot
        self._metrics = metrics
        self._series = ProtocolSeries(metrics, PROTOCOL)
        self._table: UdpFlowTable[InitialSniffer, Link] = UdpFlowTable(settings.limits)
        counts = settings.max_flows_per_client if settings.client_counts is None else settings.client_counts
        self._slots = ClientSlots(counts)  # per pending flow, then its flow
        self._refusals = QuicRefusals(
            self._table, metrics, settings.reject_budget_bytes_per_s, self._send, settings.extensions.initials
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clock: Callable[[], float] = time.monotonic
        """The loop's clock once started (bound once: the per-datagram path reads it)."""
        self._transport: asyncio.DatagramTransport | SocketOut | None = None
        self._splicer: Splicer | None = None
        """The C splice of established flows (``native``), or None: the pure-Python path."""
        self._accepting = True
        self._sweeper: asyncio.Task[None] | None = None
        self._accepted = metrics.quic_flow_series(QuicOutcome.ACCEPTED)
        """Looked up once: every flow counts one, or one ``joined`` (``server_id_joins``)."""
        self._joined = metrics.quic_flow_series(QuicOutcome.JOINED)
        self._start_joins()
        self._start_following()
        # The flow gauges are read from the table at scrape time, not updated per flow.
        metrics.pending_flows.set_function(lambda: self._table.pending_count)
        self._series.active.set_function(lambda: self._table.flow_count)
        self._empty = asyncio.Event()
        self._empty.set()
        self._replies = ClientReplies(self._learn_from_pod, self._flow_failed, self._now, self._pod_answered)
        self._datagram_errors = RateLimitedLog(log, c.QUIC_DATAGRAM_ERROR_LOG_LINES_PER_S)
        self._outboxes: Outboxes[Flow[Link]] = Outboxes(self._call_soon)

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> tuple[str, int]:
        """Bind the listener and start the sweeper; returns the bound (host, port)."""
        self._loop = loop = asyncio.get_running_loop()
        self._clock = loop.time
        splicer_type = native.splicer_type(self.settings.extensions)
        if splicer_type is None:
            transport, listener = await open_listener(host, port, reuse_port, self)
            self._transport = transport
            self._replies.attach(transport, listener)
            sockname = transport.get_extra_info("sockname")
        else:
            sock = open_socket(host, port, reuse_port)
            self._transport = SocketOut(sock)
            io_uring = self.settings.extensions.io_uring
            self._splicer = splicer = native.open_splicer(splicer_type, sock.fileno(), io_uring)
            # The splice's own methods are the callbacks: no Python frame per wake-up. What it
            # cannot splice comes back to _from_client in arrival order; the new SCIDs of pod
            # long headers teach the flow the pod's CIDs.
            loop.add_reader(sock.fileno(), splicer.pump_clients, loop.time, self._handed_back, self._splice_failed)
            loop.add_reader(splicer.epoll_fd, splicer.pump_pods, loop.time, self._learn_pod_cid, self._splice_failed,
                            self._from_pod_unconfirmed)
            sockname = sock.getsockname()
        self._open_following(loop)
        s = self.settings  # ending flows in time: ``flow_endings``
        interval = min(s.sweep_interval_s, s.limits.shortest_flow_idle_s / 4, s.limits.pending_flow_timeout_s / 4)
        self._sweeper = loop.create_task(self._sweep_forever(interval), name="quic-flow-sweeper")
        return str(sockname[0]), int(sockname[1])

    def stop_accepting(self) -> None:
        """Refuse new flows from now on (they get CONNECTION_CLOSE); routed ones keep going."""
        self._accepting = False

    async def drain(self, timeout_s: float) -> None:
        """Stop accepting, wait up to ``timeout_s`` for flows to end, then close the rest."""
        self.stop_accepting()
        if self._table.flow_count or self._table.pending_count:
            self._empty.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._empty.wait(), timeout_s)
        self._close_flows()

    async def close(self) -> None:
        """Close every flow and the listener; idempotent."""
        self._accepting = False
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        self._sweeper = None
        self._close_following()
        self._close_flows()
        self._flush_byte_counters()
        if self._splicer is not None and self._loop is not None and isinstance(self._transport, SocketOut):
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.remove_reader(self._transport.sock.fileno())
                self._loop.remove_reader(self._splicer.epoll_fd)
            self._splicer.close()
            self._splicer = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self._replies.detach()
        self._flush_byte_counters()

    @property
    def datapath(self) -> str:
        """What moves established flows' datagrams (logged at start): ``native.datapath``."""
        return native.datapath(self._splicer)

    @property
    def active_flows(self) -> int:
        return self._table.flow_count

    @property
    def pending_flows(self) -> int:
        return self._table.pending_count

    def _now(self) -> float:
        return self._clock()

    def _learn_from_pod(self, flow: Flow[Link], datagram: bytes) -> None:
        """A pod's long header read by the pure-Python path (the C splice hands SCIDs to ``_learn_pod_cid``)."""
        self._table.learn_from_pod(flow, datagram, self.settings.cid_length)

    def _learn_pod_cid(self, flow: Flow[Link], scid: bytes) -> None:
        """A new SCID the C splice read from the pod's long header (no datagram copy, no parse)."""
        self._table.learn_pod_cid(flow, scid, self.settings.cid_length)

    def _pod_answered(self, flow: Flow[Link], size: int, count: int) -> None:
        """``count`` datagrams of at most ``size`` bytes the pod sent an unconfirmed flow's client."""
        watch = flow.handshake
        if watch is not None and watch.pod_sent(size, count):
            self._confirm(flow)

    def _from_pod_unconfirmed(self, flow: Flow[Link], datagram: bytes) -> None:
        """A pod datagram of an unconfirmed flow the C splice read and handed over: sent to the client
        here (its SCID was learned already), and watched (``handshake_watch``)."""
        if flow.handle.sock is None or self._transport is None:  # ended earlier in this batch
            return
        flow.pod_bytes += len(datagram)
        flow.last_active = self._clock()
        self._replies.sent_bytes += len(datagram)
        self._transport.sendto(datagram, flow.address)
        self._pod_answered(flow, len(datagram), 1)

    # -- decisions ------------------------------------------------------------------------
    def _route(self, pending: PendingFlow[InitialSniffer], info: ClientHelloInfo, now: float) -> None:
        self._series.decision.observe(now - pending.created_at)
        hostname = info.server_name or None  # an empty SNI is a missing one
        # QUIC carries no request path, so no round-robin either.
        decision = route(hostname, None, self._snapshot(), self._template, None, port_of=_quic_port)
        self._access.decided(pending, hostname, decision, now)
        if isinstance(decision, Refused):
            self._refuse_pending(pending, hostname, decision.refusal, now)
            return
        pending.decided = True
        # Now, inside this wake-up: the datagrams that came with the ClientHello are buffered, and
        # the rest of this batch finds the flow established (a deferred dial cost a callback, an
        # idle handle and one more epoll_pwait per flow).
        self._dial(pending, decision, hostname, self._table.limits.flow_idle_timeout_s(info.max_idle_timeout_ms))

    def _dial(
        self, pending: PendingFlow[InitialSniffer], target: Target, hostname: str | None, idle_timeout_s: float,
        joined: bool = False,
    ) -> Flow[Link] | None:
        """Open the flow's socket to the pod, then flush the buffered datagrams in order; the flow, or
        None when the socket could not be opened (refused). ``joined``: opened by QUIC-LB."""
        assert self._loop is not None
        started = self._clock()
        try:
            sock = connect_udp(target.address, target.quic_port)
        except OSError as exc:
            self._refusals.log.info("quic dial to %s for %s failed: %s", target.quic_endpoint,
                                    peer(pending.address), exc)
            self._refuse_pending(pending, hostname, Refusal.DIAL_FAILED, self._clock())
            return None
        now = self._clock()
        self._series.dial.observe(now - started)
        link: Link = PodLink(self._loop, sock, self._flow_failed, self._splicer)
        flow = self._table.establish(pending, target.pod_name, link, now, idle_timeout_s, joined)
        self._slots.move(pending, flow)
        link.flow = flow
        self._access.established(pending, flow, target.quic_endpoint)
        if self._splicer is not None:  # unconfirmed: the splice hands its datagrams to the edge
            self._splicer.attach(sock.fileno(), flow.address, flow, False)
        else:
            self._loop.add_reader(sock.fileno(), self._replies.readable, link)
        if self._handoffs is not None:  # (with --workers N) beside a moved connection forwarded elsewhere?
            self._beside_moved(flow, now)
        (self._joined if joined else self._accepted).inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("quic flow %s -> %s (%s)", peer(flow.address), target.quic_endpoint, hostname)
        # The buffered datagrams leave now, in order, before the C splice may send this flow's
        # next ones: straight into the new link's outbox, not through the iteration's outboxes.
        flow.client_bytes += pending.buffered_bytes
        link.outbox.extend(pending.datagrams)
        pending.datagrams.clear()
        self._outboxes.sent_bytes += link.flush()
        return flow

    def _refuse_pending(
        self, pending: PendingFlow[InitialSniffer], hostname: str | None, refusal: Refusal, now: float
    ) -> None:
        self._table.discard_pending(pending)
        outcome, answered = self._refusals.refuse_pending(pending, hostname, refusal, now)
        ending = Termination.DIAL_FAILED if refusal is Refusal.DIAL_FAILED else Termination.REJECTED
        self._discard(pending, ending, outcome, answered)

    def _send(self, answer: bytes, addr: Address) -> bool:
        """Send a refusal answer through the listener (the refusals' only way out)."""
        if self._transport is None:
            return False
        self._transport.sendto(answer, addr)
        return True


def _quic_port(target: Target) -> int:
    return target.quic_port

"""Flows followed across workers: a moved client's datagrams reach the worker holding its flow.

With ``--workers N`` the workers share the listener (``SO_REUSEPORT``) and the kernel picks one by
the 4-tuple, so a client whose port changes (NAT rebinding) may land on a worker that holds no flow
for it. There its datagram is a miss (a short header from a new address, naming no flow of this
worker, nor a pod by QUIC-LB). Before it is counted dropped, this worker asks the others
(``HandoffKind.ASK``, over ``worker_link``); the worker whose flow learned that connection ID
joins it as it would a local rebinding (``ClientDemux._join``: the flow moves to the new address,
the pod's replies leave its own listener socket, which has the same address and port), forwards the
datagram to the pod, and claims it. From then on the asking worker forwards that address's datagrams
to the owner at once (``HandoffKind.FORWARD``): one more hop per datagram, through a local socket.

The flow never moves between workers: one access line, one live-view entry, its bytes counted
once, its client's slot where it was. A worker that is asked does not ask on (no loops); one that
cannot take an ask stays silent, and the asker counts the miss as dropped (``not_initial``) if no
claim comes within ``QUIC_HANDOFF_ASK_DEADLINE_S``; a forwarded datagram no flow takes is counted
by the worker that got it.

Only a miss comes here: a datagram of a flow this worker holds (one dict lookup in Python, or the C
splice) never does. Misses are bounded as ``handoff_book`` says: a token bucket of asks, at most so
many unanswered, at most so many forward entries, each forgotten when idle.
"""

from __future__ import annotations

import asyncio
import logging

from router import constants as c
from router.metric_families import CounterSeries
from router.outcomes import QuicDropReason, WorkerHandoff
from router.udp.flow_endings import Link
from router.udp.flow_table import Address, Flow
from router.udp.handoff_book import HandoffBook
from router.udp.handoff_codec import Handoff, HandoffError, HandoffKind, encode_handoff
from router.udp.refusals import peer
from router.udp.server_id_joins import ServerIdJoins
from router.udp.settings import UdpRouterSettings
from router.udp.verdicts import Verdict, classify_unrouted
from router.udp.worker_link import WorkerLink

log = logging.getLogger("router.udp_router")
"""The router's logger: handoff lines keep the name operators filter on."""


class WorkerFollow(ServerIdJoins):
    """Asks the other workers about misses and takes what they ask about; a base of ``UdpRouter``."""

    settings: UdpRouterSettings
    _loop: asyncio.AbstractEventLoop | None
    _handoffs: HandoffBook | None
    """None with one worker: a miss is dropped at once, as it always was."""
    _workers: WorkerLink | None
    _settle: asyncio.TimerHandle | None
    """When the oldest unanswered ask falls due (one timer at a time)."""
    _handoff_counts: dict[WorkerHandoff, CounterSeries]

    def _from_client(self, data: bytes, addr: Address) -> None:
        raise NotImplementedError  # the demux's: every client datagram

    def _join(self, flow: Flow[Link], data: bytes, addr: Address, now: float) -> None:
        raise NotImplementedError  # the demux's: a known pod CID from a new address

    def _start_following(self) -> None:
        """Set up the book and the link when this process is one of several workers."""
        self._settle = None
        self._handoffs, self._workers = None, None
        self._handoff_counts = {kind: self._metrics.quic_handoffs.labels(kind=kind) for kind in WorkerHandoff}
        workers = self.settings.workers
        if workers is None:
            return
        self._handoffs = HandoffBook(
            c.QUIC_HANDOFF_ASKS_PER_S, c.QUIC_HANDOFF_ASK_BURST, c.QUIC_HANDOFF_MAX_ASKS,
            c.QUIC_HANDOFF_MAX_FORWARDS, c.QUIC_HANDOFF_ASK_DEADLINE_S, self._table.limits.idle_timeout_s,
        )
        self._workers = WorkerLink(workers, self._handed_over, self._forwards_lost)

    def _open_following(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read this worker's inbox; if its descriptors are unusable (a supervisor of another
        version), this worker routes as a lone one would: its misses are dropped, the router runs."""
        if self._workers is None:
            return
        try:
            self._workers.open(loop)
        except OSError as exc:
            log.warning("worker %d cannot reach the other workers (%s): a client that moves to this worker "
                        "is not followed to its flow's", self._workers.workers.index, exc)
            self._handoffs = self._workers = None

    def _close_following(self) -> None:
        if self._settle is not None:
            self._settle.cancel()
            self._settle = None
        if self._workers is not None:
            self._workers.close()

    # -- the asking side ------------------------------------------------------------------
    def _follow_miss(self, data: bytes, addr: Address, now: float) -> bool:
        """A miss, before it is dropped: True when another worker was sent it (forwarded to the
        owner a claim named, or asked about); False to drop it now (one worker, or over the rate)."""
        book, link = self._handoffs, self._workers
        if book is None or link is None:
            return False
        owner = book.owner(addr, now)
        if owner is not None:
            return self._forward(link, owner, data, addr)
        try:  # encoded before the ask is taken: a record that cannot be is a miss dropped once, now
            record = encode_handoff(HandoffKind.ASK, book.next_ask_id, addr, data)
        except HandoffError:  # a scoped IPv6 address, a datagram over 64 KiB: not followed
            return False
        if book.ask(addr, now) is None:
            self._handoff_counts[WorkerHandoff.ASK_LIMITED].inc()
            return False
        for index in link.workers.others:
            link.queue(index, record)
        self._handoff_counts[WorkerHandoff.ASKED].inc()
        if self._settle is None and self._loop is not None:
            self._settle = self._loop.call_at(now + c.QUIC_HANDOFF_ASK_DEADLINE_S, self._settle_asks)
        return True

    def _follow_unnamed(self, data: bytes, addr: Address, now: float) -> bool:
        """A short header of a shared address naming none of its flows here: True when a claim
        sent this address's datagrams to another worker (a moved connection of the same client
        socket as this worker's flows there), forwarded; False: the address's first flow takes it."""
        book, link = self._handoffs, self._workers
        owner = book.owner(addr, now) if book is not None else None
        return owner is not None and link is not None and self._forward(link, owner, data, addr)

    def _forward(self, link: WorkerLink, owner: int, data: bytes, addr: Address) -> bool:
        try:
            record = encode_handoff(HandoffKind.FORWARD, 0, addr, data)
        except HandoffError:
            return False
        link.queue(owner, record, forward=True)
        self._handoff_counts[WorkerHandoff.FORWARDED].inc()
        return True

    def _beside_moved(self, flow: Flow[Link], now: float) -> None:
        """A flow just routed here, at an address whose datagrams a claim sends to another worker
        (a connection of that client socket moved there first): told apart by connection ID from
        the start (``Flow.shared``; the C splice learns the client's original DCID, then the pod's
        CIDs), so the moved connection's short headers still reach their worker, not this flow."""
        book = self._handoffs
        if book is None or book.owner(flow.address, now) is None:
            return
        flow.shared = True
        if flow.client_dcids:
            flow.handle.learned(flow.client_dcids[0])

    def _settle_asks(self) -> None:
        """Count the asks nobody claimed as dropped misses; wait for the next one due."""
        self._settle = None
        book = self._handoffs
        if book is None or self._loop is None:
            return
        unclaimed = book.overdue(self._clock())
        if unclaimed:
            self._drop(QuicDropReason.NOT_INITIAL, unclaimed)
        due = book.next_deadline
        if due is not None:
            self._settle = self._loop.call_at(due, self._settle_asks)

    def _forwards_lost(self, count: int) -> None:
        """A message to the owner was refused (its queue full, it restarting): its forwarded datagrams dropped."""
        self._drop(QuicDropReason.NOT_INITIAL, count)

    # -- the asked side -------------------------------------------------------------------
    def _handed_over(self, handoff: Handoff, sender: int) -> None:
        """A record from worker ``sender``: a claim to learn, or a client datagram to take if ours."""
        book, link = self._handoffs, self._workers
        if book is None or link is None:
            return
        addr, data = handoff.address, handoff.payload
        if handoff.kind is HandoffKind.CLAIM:
            book.claimed(handoff.ask_id, addr, sender, self._clock())
            return
        if self._table.flow(addr) is not None:  # the flow moved here already: its usual path
            self._from_client(data, addr)
            taken = True
        else:
            taken = self._take_moved(handoff, data, addr)
        if taken and handoff.kind is HandoffKind.ASK:
            link.queue(sender, encode_handoff(HandoffKind.CLAIM, handoff.ask_id, addr))
            self._handoff_counts[WorkerHandoff.CLAIMED].inc()

    def _take_moved(self, handoff: Handoff, data: bytes, addr: Address) -> bool:
        """Join the flow whose connection ID the datagram names (True), else leave it: an ask to
        the asker's count, a forward (its flow gone) counted dropped here."""
        now = self._clock()
        unrouted = classify_unrouted(
            self._table, data, addr, now, self.settings.cid_length, self.settings.extensions.initials
        )
        if unrouted.verdict is Verdict.JOIN and unrouted.flow is not None:
            if log.isEnabledFor(logging.DEBUG):
                log.debug("quic flow to %s followed to %s through another worker", unrouted.flow.pod_name, peer(addr))
            self._join(unrouted.flow, data, addr, now)
            return True
        if handoff.kind is HandoffKind.FORWARD:
            self._drop(unrouted.drop_reason or QuicDropReason.MALFORMED)
        return False

    @property
    def handoff_book(self) -> HandoffBook | None:
        """This worker's forward entries and unanswered asks (None with one worker)."""
        return self._handoffs

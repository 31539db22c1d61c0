"""When a routed QUIC flow is *confirmed*: a real client and its pod are talking, not a flood.

Sans-IO. Confirmation is what a blind sender cannot produce (docs/quic.md, how long a flow lives).
A routed flow: a client short header whose DCID the pod chose, learned only from the pod's answer.
A joined flow: a pod datagram as long as the client's longest, or more of them than the client sent;
a stateless reset (RFC 9000 section 10.3: one shorter datagram per datagram) does neither. Until
then the flow lives only ``--quic-handshake-timeout-ms`` and is the first evicted.
"""

from __future__ import annotations

from collections.abc import Iterable

LONG_HEADER = 0x80
"""RFC 9000 section 17: the first bit of a long header; a short header (1-RTT) has it clear."""


class HandshakeWatch:
    """What one unconfirmed flow has shown so far."""

    __slots__ = ("client_datagrams", "joined", "longest_client", "opened_at", "pod_answered", "pod_chose_cid",
                 "pod_datagrams")

    def __init__(self, opened_at: float, joined: bool = False) -> None:
        self.opened_at = opened_at
        """When the flow was opened: its handshake deadline counts from here."""
        self.joined = joined
        """Opened by QUIC-LB: the pod's answers confirm it, not the client's short headers."""
        self.pod_answered = False
        self.pod_chose_cid = False
        """The router learned a connection ID of the pod's for this flow (it may have moved on since)."""
        self.client_datagrams = 0
        self.longest_client = 0
        self.pod_datagrams = 0

    def client_sent(self, datagram: bytes, pod_cids: Iterable[bytes]) -> bool:
        """A client datagram of the flow; True when it confirms the flow."""
        self.client_datagrams += 1
        self.longest_client = max(self.longest_client, len(datagram))
        if self.joined or not datagram or datagram[0] & LONG_HEADER:
            return False
        for cid in pod_cids:
            if datagram.startswith(cid, 1):
                return True
        return self.pod_answered and not self.pod_chose_cid

    def pod_sent(self, size: int, count: int = 1) -> bool:
        """``count`` pod datagrams of at most ``size`` bytes each (a GRO read: equal segments but the
        last); True when they confirm a joined flow."""
        self.pod_answered = True
        self.pod_datagrams += count
        if not self.joined:
            return False
        return size >= self.longest_client or self.pod_datagrams > self.client_datagrams

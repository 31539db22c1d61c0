"""What moves a QUIC flow's datagrams: one interface, a pure-Python and a C implementation.

The edge decides (which flow, which pod, when it is confirmed); a datapath only moves bytes and
reports through ``PathEvents`` what it does not move itself. Which one runs is chosen once, from
``Extensions`` (``edge.open_datapath``); nothing else branches on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from router.udp.flows import Address, Flow
from router.udp.pod_link import PodLink

Link = PodLink["Flow[Link]"]
"""A flow's pod link; the flow table keeps it as the flow's handle."""


@dataclass(frozen=True, slots=True)
class PathEvents:
    """What a datapath tells the edge."""

    client_datagram: Callable[[bytes, Address], None]
    """A client datagram the datapath did not move itself (every one, on the pure-Python path)."""
    pod_cid: Callable[[Flow[Link], bytes], None]
    """A new SCID in a pod's long header: the client's later DCID, which follows the flow when it moves."""
    pod_answered: Callable[[Flow[Link], int, int], None]
    """``(flow, size, count)``: an unconfirmed flow's pod sent ``count`` datagrams of at most ``size``."""
    pod_failed: Callable[[Flow[Link], Exception], None]
    """A pod socket error (ECONNREFUSED: the pod is gone): the edge ends the flow."""


class Datapath(Protocol):
    """Moves the datagrams of the flows attached to it."""

    @property
    def name(self) -> str:
        """What the start line says: ``python``, ``c_splice`` or ``c_splice+io_uring``."""

    async def open(self, host: str, port: int, reuse_port: bool, events: PathEvents) -> tuple[str, int]:
        """Bind the public socket and start reading it; the bound ``(host, port)``."""

    def attach(self, flow: Flow[Link]) -> None:
        """Start reading the flow's pod socket (the flow is unconfirmed: watched through ``events``)."""

    def confirm(self, flow: Flow[Link]) -> None:
        """The flow is confirmed: move its datagrams both ways without asking."""

    def moved(self, flow: Flow[Link]) -> None:
        """The flow's client is at ``flow.address`` now."""

    def learned(self, flow: Flow[Link], cid: bytes) -> None:
        """A pod CID learned outside the pod's long headers (a join): tell the flow's datagrams apart by it."""

    def detach(self, flow: Flow[Link]) -> None:
        """Stop reading the flow's pod socket (before the edge closes it)."""

    def send_to_client(self, datagram: bytes, address: Address) -> bool:
        """Send through the public socket (refusals, version negotiation); False when closed."""

    def take_counts(self) -> tuple[int, int]:
        """Bytes this datapath moved to pods and to clients since the last call."""

    def close(self) -> None:
        """Stop reading; close the public socket. Idempotent."""

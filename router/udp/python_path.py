"""The pure-Python datapath: the reference the C splice is tested against (``datapath``).

The edge sees every client datagram, so confirmation changes nothing here; each attached pod socket
has a reader of its own (``pod_to_client.ClientReplies``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from router.udp.datapath import Link, PathEvents
from router.udp.flows import Address, Flow
from router.udp.listener import open_listener
from router.udp.pod_to_client import ClientReplies


class PythonDatapath:
    """Moves every flow's datagrams through the event loop."""

    name = "python"

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transport: asyncio.DatagramTransport | None = None
        self._replies: ClientReplies | None = None

    async def open(self, host: str, port: int, reuse_port: bool, events: PathEvents) -> tuple[str, int]:
        self._loop = asyncio.get_running_loop()
        transport, listener = await open_listener(host, port, reuse_port, events.client_datagram)
        self._transport = transport
        self._replies = ClientReplies(events, self._clock)
        self._replies.attach(transport, listener)
        sockname = transport.get_extra_info("sockname")
        return str(sockname[0]), int(sockname[1])

    def attach(self, flow: Flow[Link]) -> None:
        link = flow.handle
        if self._loop is not None and self._replies is not None and link.sock is not None:
            self._loop.add_reader(link.sock.fileno(), self._replies.readable, link)

    def confirm(self, flow: Flow[Link]) -> None:
        """Nothing changes: this path hands the edge every datagram."""

    def moved(self, flow: Flow[Link]) -> None:
        """Nothing to do: replies go to ``flow.address``, read when they are sent."""

    def learned(self, flow: Flow[Link], cid: bytes) -> None:
        """Nothing to do: the edge tells flows apart itself."""

    def detach(self, flow: Flow[Link]) -> None:
        sock = flow.handle.sock
        if self._loop is not None and sock is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.remove_reader(sock.fileno())

    def send_to_client(self, datagram: bytes, address: Address) -> bool:
        if self._transport is None:
            return False
        self._transport.sendto(datagram, address)
        return True

    def take_counts(self) -> tuple[int, int]:
        """What the pod readers sent clients (what the edge sent pods it counts itself)."""
        if self._replies is None:
            return 0, 0
        sent, self._replies.sent_bytes = self._replies.sent_bytes, 0
        return 0, sent

    def close(self) -> None:
        if self._replies is not None:
            self._replies.detach()
        if self._transport is not None:
            self._transport.close()
            self._transport = None

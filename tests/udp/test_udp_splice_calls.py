"""The C splice (``router/udp/_splice.c``) called the ways a careless caller may call it.

Each flow's client address names exactly one pod socket, whatever ``rekey`` is asked; a pod fd or
a size that cannot be right is refused at once (never a loop without end, never an array too small
for what is written into it); a flow object that calls back into the splice from an attribute the
splice writes cannot free what the splice is using; and a splice dropped with flows attached is
collected with them, although each flow's link points back at it. Real loopback UDP sockets.
"""

from __future__ import annotations

import gc
import socket
import subprocess
import sys
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from router.extensions import SPLICE_MODULE, Extensions, is_built
from router.udp import native
from router.udp.flows import Flow

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not is_built(SPLICE_MODULE), reason="the C splice is not built (no C compiler)"),
]

ROOT = Path(__file__).resolve().parents[2]
ROUTER_HOST, POD_HOST = "127.0.0.1", "127.0.0.2"


def udp(host: str, stack: ExitStack) -> socket.socket:
    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
    sock.bind((host, 0))
    sock.settimeout(5.0)
    return sock


def short(n: int) -> bytes:
    """A short-header-looking datagram numbered ``n``."""
    return bytes([0x40]) + n.to_bytes(4, "big") + bytes(95)


class Spliced:
    """A splicer on a public socket, and flows attached to it: client i <-> pod i through link i."""

    def __init__(self, stack: ExitStack, flows: int, batches: int = 4) -> None:
        splicer_type = native.splicer_type(Extensions(splice=True))
        assert splicer_type is not None
        self.public = udp(ROUTER_HOST, stack)
        self.public.setblocking(False)
        self.splicer = splicer_type(self.public.fileno(), batches, 64)
        stack.callback(self.splicer.close)
        self.clients, self.pods, self.links, self.flows = [], [], [], []
        for _ in range(flows):
            self.add(stack)

    def add(self, stack: ExitStack) -> int:
        client, pod = udp(ROUTER_HOST, stack), udp(POD_HOST, stack)
        link = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK))
        link.connect(pod.getsockname())
        flow: Flow[None] = Flow(client.getsockname(), "stargate-0", None, last_active=0.0)
        self.splicer.attach(link.fileno(), client.getsockname(), flow)
        self.clients.append(client)
        self.pods.append(pod)
        self.links.append(link)
        self.flows.append(flow)
        return len(self.flows) - 1

    def send(self, i: int, datagram: bytes) -> None:
        self.clients[i].sendto(datagram, self.public.getsockname())

    def reaches_pod(self, i: int, datagram: bytes) -> bool:
        self.pods[i].settimeout(0.5)
        try:
            return self.pods[i].recv(65536) == datagram
        except TimeoutError:
            return False


@contextmanager
def spliced(flows: int, batches: int = 4) -> Iterator[Spliced]:
    with ExitStack() as stack:
        yield Spliced(stack, flows, batches)


def test_rekey_to_the_flows_own_address_keeps_it_spliced() -> None:
    """Before, the new entry was set and then the old one, the same key, deleted: the flow lost its
    address, and its datagrams went to Python as a stranger's."""
    with spliced(1) as x:
        x.splicer.rekey(x.links[0].fileno(), x.clients[0].getsockname())
        x.send(0, short(1))
        assert x.splicer.from_clients(1.0) == []
        assert x.reaches_pod(0, short(1))


def test_rekey_to_another_flows_address_joins_it_and_sends_no_datagram_to_a_pod_it_does_not_name() -> None:
    """Before, flow 0 took flow 1's address entry: flow 1's client's datagrams went to flow 0's pod.
    Now flow 0 joins flow 1 there (one endpoint's connections follow it when it rebinds): the two are
    told apart by the pod CIDs their datagrams carry, and with none learned yet every datagram of
    that address goes to Python, never to either pod (test_udp_splice_shared has the rest)."""
    with spliced(2) as x:
        x.splicer.rekey(x.links[0].fileno(), x.clients[1].getsockname())
        x.send(1, short(11))
        x.send(0, short(10))  # flow 0's old address is a stranger's now
        assert x.splicer.from_clients(1.0) == [(short(11), x.clients[1].getsockname()),
                                               (short(10), x.clients[0].getsockname())]
        assert not x.reaches_pod(1, short(11)) and not x.reaches_pod(0, short(11))
        x.splicer.detach(x.links[1].fileno())
        x.send(1, short(12))  # flow 0 alone there, still told apart by CID: nothing learned, Python judges
        assert x.splicer.from_clients(2.0) == [(short(12), x.clients[1].getsockname())]
        assert x.splicer.flows == 1


def test_rekey_moves_a_flow_to_a_free_address() -> None:
    with spliced(1) as x, ExitStack() as stack:
        moved = udp(ROUTER_HOST, stack)
        x.splicer.rekey(x.links[0].fileno(), moved.getsockname())
        moved.sendto(short(2), x.public.getsockname())
        x.send(0, short(3))  # the old address is a stranger now
        assert x.splicer.from_clients(1.0) == [(short(3), x.clients[0].getsockname())]
        assert x.reaches_pod(0, short(2))


def short_to(cid: bytes, n: int) -> bytes:
    """A short header carrying ``cid`` as its DCID, numbered ``n``."""
    return b"\x40" + cid + n.to_bytes(4, "big") + bytes(40)


def test_a_flow_named_by_learn_takes_only_datagrams_carrying_that_cid_even_alone_at_its_address() -> None:
    """A QUIC-LB joined flow: its client socket may carry another connection, to another pod, that
    moved here with it; that one's datagrams go to Python (which opens its own flow), never to this pod."""
    with spliced(1) as x:
        cid = b"\x2b\x7f\x00\x00\x02" + bytes(7)
        x.splicer.learn(x.links[0].fileno(), cid)
        x.send(0, short_to(cid, 1))
        assert x.splicer.from_clients(1.0) == []
        assert x.reaches_pod(0, short_to(cid, 1))
        other = b"\x2b\x7f\x00\x00\x03" + bytes(7)
        x.send(0, short_to(other, 2))
        assert x.splicer.from_clients(2.0) == [(short_to(other, 2), x.clients[0].getsockname())]
        assert not x.reaches_pod(0, short_to(other, 2))


def test_learn_refuses_an_fd_not_attached_and_a_cid_of_no_v1_length() -> None:
    with spliced(1) as x:
        with pytest.raises(KeyError):
            x.splicer.learn(x.links[0].fileno() + 1000, b"\x01" * 8)
        for bad in (b"", b"\x01" * 21):
            with pytest.raises(ValueError):
                x.splicer.learn(x.links[0].fileno(), bad)
        with pytest.raises(TypeError):
            x.splicer.learn(x.links[0].fileno(), "cid")  # type: ignore[arg-type]
        x.send(0, short(1))  # nothing learned: still the lone flow's every datagram
        assert x.splicer.from_clients(1.0) == [] and x.reaches_pod(0, short(1))


@pytest.mark.parametrize("batches", [0, -1, 2**25 + 1, 2**31 - 1])
def test_a_batch_count_out_of_range_is_refused(batches: int) -> None:
    """``batches * 64`` sized the list every flow a call touches is written to: past 2^25 it
    overflowed to a list of 128, which a call with more flows wrote past."""
    with ExitStack() as stack:
        public = udp(ROUTER_HOST, stack)
        splicer_type = native.splicer_type(Extensions(splice=True))
        assert splicer_type is not None
        with pytest.raises(ValueError):
            splicer_type(public.fileno(), batches, 64)
        with pytest.raises(ValueError):
            splicer_type(public.fileno(), 4, batches)


def test_every_flow_a_call_touches_is_counted_with_more_flows_than_one_batch() -> None:
    with spliced(150, batches=8) as x:
        for i in range(150):
            x.send(i, short(i))
        assert x.splicer.from_clients(3.0) == []
        assert all(flow.client_bytes == 100 and flow.last_active == 3.0 for flow in x.flows)


HUGE_FD_ATTACH = """
import socket, sys
from router.udp._splice import Splicer
from router.udp.flows import Flow
public = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
public.bind(("127.0.0.1", 0))
splicer = Splicer(public.fileno(), 4, 64)
try:
    splicer.attach(2**31 - 1, ("127.0.0.1", 4433), Flow(("127.0.0.1", 4433), "stargate-0", None, last_active=0.0))
except (OSError, ValueError) as exc:
    print(type(exc).__name__)
    sys.exit(0)
sys.exit(3)
"""


def test_attaching_an_fd_that_is_not_open_is_refused_at_once() -> None:
    """Before, ``while (length <= fd) length *= 2`` overflowed for an fd past 2^30 and never ended
    (run in a child: a regression would hang, not take the test run down)."""
    child = subprocess.run([sys.executable, "-c", HUGE_FD_ATTACH], cwd=ROOT, capture_output=True, text=True,
                           timeout=30, check=False)
    assert child.returncode == 0, child.stdout + child.stderr


def test_attaching_what_is_not_a_pod_socket_is_refused() -> None:
    with spliced(0) as x, ExitStack() as stack:
        stream = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        flow: Flow[None] = Flow(("127.0.0.1", 9), "stargate-0", None, last_active=0.0)
        for fd in (-1, stream.fileno(), x.public.fileno()):
            with pytest.raises((ValueError, OSError)):
                x.splicer.attach(fd, ("127.0.0.1", 9), flow)
        assert x.splicer.flows == 0


def test_a_listener_that_is_not_a_udp_socket_is_refused() -> None:
    splicer_type = native.splicer_type(Extensions(splice=True))
    assert splicer_type is not None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as stream:
        stream.bind(("127.0.0.1", 0))
        with pytest.raises(ValueError):
            splicer_type(stream.fileno(), 4, 64)
    with pytest.raises(OSError):
        splicer_type(-1, 4, 64)


def test_a_pump_without_callables_is_refused_before_it_takes_a_datagram() -> None:
    with spliced(1) as x:
        x.send(0, short(5))
        with pytest.raises(TypeError):
            x.splicer.pump_clients(lambda: 1.0, None, None)
        with pytest.raises(TypeError):
            x.splicer.pump_pods(lambda: 1.0, print, print, "not callable")
        with pytest.raises(TypeError):
            x.splicer.pump_pods(lambda: 1.0, print, print)  # type: ignore[call-arg]
        assert x.splicer.from_clients(2.0) == []  # the datagram waited for a proper call
        assert x.reaches_pod(0, short(5))


def test_a_callback_that_raises_for_one_datagram_costs_the_calls_other_datagrams_nothing() -> None:
    """Strangers' datagrams handed back in one call, two of whose handling raises (a bug): every
    other one still reaches the handler, in arrival order, a flow's datagram is still spliced, and
    the first exception is raised once, after the last datagram (the loop reports it once)."""
    with spliced(1) as x, ExitStack() as stack:
        strangers = [udp(ROUTER_HOST, stack) for _ in range(6)]
        for n, stranger in enumerate(strangers):
            stranger.sendto(short(n), x.public.getsockname())
            if n == 2:
                x.send(0, short(100))  # the attached flow's, among them
        got: list[bytes] = []

        def on_datagram(data: bytes, address: tuple[str, int]) -> None:
            got.append(data)
            if data in (short(1), short(3)):
                raise ValueError(f"a bug on datagram {data[4]}")

        with pytest.raises(ValueError, match="a bug on datagram 1"):
            x.splicer.pump_clients(lambda: 1.0, on_datagram, lambda *a: None)
        assert got == [short(n) for n in range(6)]
        assert x.reaches_pod(0, short(100))
        x.send(0, short(101))  # and the next call is an ordinary one
        assert x.splicer.pump_clients(lambda: 2.0, on_datagram, lambda *a: None) is None
        assert x.reaches_pod(0, short(101))


def test_what_is_no_exception_stops_the_delivery_at_once() -> None:
    """KeyboardInterrupt, SystemExit: the process is going, the call's later datagrams with it."""
    with spliced(0) as x, ExitStack() as stack:
        for n in range(3):
            udp(ROUTER_HOST, stack).sendto(short(n), x.public.getsockname())
        got: list[bytes] = []

        def on_datagram(data: bytes, address: tuple[str, int]) -> None:
            got.append(data)
            if data == short(0):
                raise ValueError("kept, then dropped for what stops the loop")
            if data == short(1):
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            x.splicer.pump_clients(lambda: 1.0, on_datagram, lambda *a: None)
        assert got == [short(0), short(1)]


def test_a_learn_callback_that_raises_for_one_flow_costs_the_other_flows_nothing() -> None:
    with spliced(3) as x:
        for n in range(3):  # each pod's Handshake-like long header, a new SCID of its own
            header = b"\xe0\x00\x00\x00\x01\x08" + bytes(8) + b"\x08" + bytes([n]) * 8
            x.pods[n].sendto(header + bytes(60), x.links[n].getsockname())
        learned: list[tuple[object, bytes]] = []

        def on_learn(flow: object, scid: bytes) -> None:
            learned.append((flow, scid))
            if len(learned) == 1:
                raise ValueError("a bug on the first flow's CID")

        with pytest.raises(ValueError, match="first flow"):  # the three were sent: one call reads them all
            x.splicer.pump_pods(lambda: 1.0, on_learn, lambda *a: None, lambda *a: None)
        assert sorted(scid for _flow, scid in learned) == [bytes([n]) * 8 for n in range(3)]


class DetachingFlow:
    """A flow whose ``last_active`` setter detaches it: a careless flow class, not the router's."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.client_bytes = self.pod_bytes = 0
        self._last_active = 0.0
        self.splicer: Any = None
        self.fd = -1

    @property
    def last_active(self) -> float:
        return self._last_active

    @last_active.setter
    def last_active(self, value: float) -> None:
        self._last_active = value
        self.splicer.detach(self.fd)


def test_a_flow_that_calls_back_into_the_splice_while_it_is_counted_is_refused() -> None:
    """The counts are written into the flow objects after the batch: a setter that detaches its
    flow there freed the flow's slot while the splice still walked it."""
    with spliced(0) as x, ExitStack() as stack:
        client, pod = udp(ROUTER_HOST, stack), udp(POD_HOST, stack)
        link = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK))
        link.connect(pod.getsockname())
        flow = DetachingFlow(client.getsockname())
        flow.splicer, flow.fd = x.splicer, link.fileno()
        x.splicer.attach(link.fileno(), client.getsockname(), flow)
        client.sendto(short(1), x.public.getsockname())
        with pytest.raises(RuntimeError, match="re-entered"):
            x.splicer.from_clients(1.0)
        assert x.splicer.flows == 1


class LinkedFlow:
    """A flow whose link points back at the splice, as the router's do (flow.handle.splicer)."""

    def __init__(self, splicer: Any) -> None:
        self.splicer = splicer
        self.last_active = 0.0
        self.client_bytes = self.pod_bytes = 0


def test_a_splice_dropped_with_flows_attached_is_collected_with_them() -> None:
    """splice -> flow -> link -> splice is a cycle; without GC support on the splice it was never freed."""
    splicer_type = native.splicer_type(Extensions(splice=True))
    assert splicer_type is not None
    with ExitStack() as stack:
        public, pod = udp(ROUTER_HOST, stack), udp(POD_HOST, stack)
        link = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        link.connect(pod.getsockname())
        splicer = splicer_type(public.fileno(), 4, 64)
        flow = LinkedFlow(splicer)
        splicer.attach(link.fileno(), ("127.0.0.1", 4433), flow)
        gone = weakref.ref(flow)
        del splicer, flow
        gc.collect()
        assert gone() is None, "the splice and its flows were leaked"

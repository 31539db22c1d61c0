"""Fuzz targets of the QUIC edge: the Initial frame walker, the Initial sniffer (on protected
datagrams and on re-encrypted mutated frames) and the ``UdpRouter``'s whole unrouted-datagram
path without sockets, seeded with real aioquic first flights and their rewritten hard shapes.
The ``*_native`` targets hold the C of ``quic/_initial_protection.c`` to the pure-Python
reference (``tests/support/initial_reference.py``), never to itself; their corpora grow from
structured mutations (``mutators_native``) kept in ``tests/fuzz/corpus/``."""

from __future__ import annotations

import functools
import logging
import random
import re
from collections.abc import Sequence
from typing import Any

from discovery.targets import Target, TargetSnapshot
from quic import native
from quic.frames import QUIC_MAX_CRYPTO_BYTES, CryptoReassembler, walk_initial_frames
from quic.initial_keys import client_initial_keys, encrypt_initial
from quic.initial_sniffer import InitialSniffer
from quic.packet import (
    MAX_CID_LENGTH,
    QUIC_V1,
    QUIC_V2,
    PacketType,
    QuicPacketError,
    encode_varint,
    read_long_header,
)
from router.metrics import RouterMetrics
from router.udp.edge import UdpRouter
from router.udp.flow_limits import FlowLimits
from router.udp.quic_lb import MAX_SERVER_ID_BYTES, routable_cid, server_id
from router.udp.settings import UdpRouterSettings
from tests.fuzz.mutators_native import mutate_first_payloads, mutate_frames, mutate_long_headers
from tests.fuzz.seed_flights import first_flight, quic_hellos
from tests.fuzz.target import CORPUS_DIR, SEPARATOR, TEMPLATE, FuzzTarget, check
from tests.fuzz.targets_tls import hellos, mutate_hello
from tests.support.initial_reference import (
    c_hello_agrees,
    c_long_header_agrees,
    c_sniffer_agrees,
    first_header,
    reference_hello,
)
from tests.support.quic_frames import crypto_frame
from tests.support.quic_initial_rewriter import CASES, rewrite_flight

FUZZ_DCID = bytes.fromhex("8394c8f03e515708")
"""The client DCID of RFC 9001 appendix A: any fixed value works, the keys follow from it."""
FUZZ_SCID = bytes.fromhex("c0ffee00c0ffee00")
MAX_DATAGRAMS = 16
"""Datagrams (or payloads) one input is cut into at most: a first flight is 1-3."""


def run_initial_frames(data: bytes) -> str:
    crypto = CryptoReassembler()
    count = 0
    for offset, chunk in walk_initial_frames(data):
        check(offset >= 0 and len(chunk) <= len(data), "CRYPTO frame out of its payload")
        crypto.add(offset, chunk)
        count += 1
    check(len(crypto.contiguous()) == crypto.contiguous_length, "contiguous length")
    return f"crypto-frames-{min(count, 3)}"


def shape(answer: object) -> str:
    """An answer's kind for the fuzzer's outcome count: a type name, and an error's message with
    numbers blanked (a new kind of refusal is a new outcome, a new number is not)."""
    if isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], type):
        answer = answer[0](answer[1])
    if isinstance(answer, BaseException):
        return f"{type(answer).__name__}:{re.sub(r'0x[0-9a-fA-F]+|[0-9]+', '#', str(answer))[:50]}"
    return type(answer).__name__


def run_initial_native(data: bytes) -> str:
    """The C reading of a first Initial payload (when built) is the Python reference's, or declines."""
    found = c_hello_agrees(data, QUIC_MAX_CRYPTO_BYTES)
    return f"{'declined' if found is None else 'read'}-{shape(reference_hello(data))}"


def run_long_header_native(data: bytes) -> str:
    """The C parse of a long header (when built) is ``read_long_header``'s, or declines: at the start
    of each cut of the input and at every offset the reference says a coalesced packet starts."""
    extension = native.EXTENSION
    read = declined = 0
    last = "none"
    for datagram in data.split(SEPARATOR)[:MAX_DATAGRAMS]:
        offset = 0
        while offset < len(datagram):
            answer = c_long_header_agrees(datagram, offset)
            fields = extension.long_header(datagram, offset) if extension is not None else None
            read, declined = read + (fields is not None), declined + (fields is None)
            last = shape(answer)
            try:
                header = read_long_header(datagram, offset)
            except QuicPacketError:
                break
            if header.packet_type in (None, PacketType.RETRY) or header.end <= offset:
                break
            offset = header.end
    return f"read{min(read, 3)}-declined{min(declined, 3)}-{last}"


def _sniff(datagrams: Sequence[bytes]) -> str:
    sniffer = InitialSniffer(native=native.EXTENSION)  # the router's reading where C is built
    for i, datagram in enumerate(datagrams[:MAX_DATAGRAMS]):
        info = sniffer.feed(datagram, None if i else first_header(datagram, native.EXTENSION))
        if info is not None:
            check(sniffer.feed(datagram) is info, "a complete sniffer changed its answer")
            if info.server_name:
                TEMPLATE.pod_name_for(info.server_name)
            return "hello"
    return "incomplete"


def run_sniffer_datagrams(data: bytes) -> str:
    return _sniff(data.split(SEPARATOR))


@functools.cache
def _client_keys(version: int) -> Any:
    return client_initial_keys(version, FUZZ_DCID)


def protect_payloads(data: bytes) -> list[bytes]:
    """Payload-target input -> client Initial datagrams: byte 0 picks version and PN length,
    the rest is frames, one Initial per ``SEPARATOR``-separated part, padded to 1200 bytes."""
    if not data:
        return []
    version = QUIC_V2 if data[0] & 1 else QUIC_V1
    pn_length = 1 + (data[0] >> 1 & 3)
    out = []
    for number, frames in enumerate(data[1:].split(SEPARATOR)[:MAX_DATAGRAMS]):
        padded = frames + bytes(max(0, 1162 - len(frames)))
        out.append(encrypt_initial(version, FUZZ_DCID, FUZZ_SCID, number, padded, _client_keys(version),
                                   pn_length=pn_length))
    return out


def run_sniffer_payloads(data: bytes) -> str:
    return _sniff(protect_payloads(data))


def run_first_initial_native(data: bytes) -> str:
    """A flow's first Initial read in one C call (when built) leaves the sniffer as the Python path does."""
    answers: tuple[object, ...] = c_sniffer_agrees(protect_payloads(data))[0]  # type: ignore[assignment]
    if not answers:
        return "empty"
    last = answers[-1]  # the first Initial's reading (the C's part), then how the flight ended
    return f"{shape(answers[0])}|{type(last[0] if isinstance(last, tuple) else last).__name__}"


def corpus(name: str) -> list[bytes]:
    """The inputs the fuzzer kept for target ``name`` (``run_fuzz --save-corpus``): each found a new outcome."""
    return [path.read_bytes() for path in sorted(CORPUS_DIR.glob(f"{name}-*.bin"))]


class _Clock:
    """Stands in for the event loop: the router only asks it the time on this path."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now


class _AnswerSink:
    """The listener transport: every answer must fit in the datagram being handled."""

    def __init__(self) -> None:
        self.provoking = 0

    def sendto(self, data: bytes, addr: Any = None) -> None:
        check(0 < len(data) <= self.provoking, f"{len(data)}-byte answer to a {self.provoking}-byte datagram")

    def close(self) -> None:
        pass


@functools.cache
def _metrics() -> RouterMetrics:
    """One registry for every run: building its families costs more than a run."""
    return RouterMetrics()


def _router() -> tuple[UdpRouter, _Clock, _AnswerSink]:
    """A fresh socket-less router per run: no state (table, refusals, slots) leaks between inputs."""
    snapshot = TargetSnapshot.of([Target("stargate-0", "127.0.0.1", 1, 9)])
    settings = UdpRouterSettings(limits=FlowLimits(max_pending_flows=8), quic_lb_server_id_bytes=4)
    router = UdpRouter(settings, TEMPLATE, lambda: snapshot, _metrics())
    clock, sink = _Clock(), _AnswerSink()
    router._loop = clock  # type: ignore[assignment]
    router._transport = sink  # type: ignore[assignment]
    router._dial = _no_dial  # type: ignore[method-assign]
    return router, clock, sink


def _no_dial(pending: Any, target: Any, hostname: Any, idle_timeout_s: float, joined: bool = False) -> None:
    """A routable name (or a QUIC-LB server ID): no socket is opened, the flow stays pending until swept."""


def run_udp_router(data: bytes) -> str:
    """Datagrams from client addresses into a socket-less UdpRouter: nothing may raise (nor be
    logged as a bug), no answer may exceed the datagram that provoked it, pending flows stay
    bounded, and no connection ID the router keeps is over 20 octets."""
    router, clock, sink = _router()
    port = 40000
    for datagram in data.split(SEPARATOR)[:MAX_DATAGRAMS]:
        if not datagram:  # an empty part (two separators in a row): the next client speaks
            port += 1
            continue
        clock.now += 0.25
        sink.provoking = len(datagram)
        router._from_client(datagram, ("127.0.0.9", port))
        check(router._datagram_errors.suppressed == 0 and not _logged_bugs(), "a datagram met a bug")
        router.sweep(clock.now)
        check(router.pending_flows <= router.settings.limits.max_pending_flows, "pending flows over the bound")
        check(all(len(cid) <= MAX_CID_LENGTH for cid in _kept_cids(router)), "a connection ID over 20 octets kept")
    return f"pending-{router.pending_flows}"


def _kept_cids(router: UdpRouter) -> list[bytes]:
    """Every connection ID the router's table keeps: pending flows' keys, flows' learned and client IDs."""
    table = router._table
    kept = [cid for pending in table.pending_flows() for cid in (pending.dcid, pending.scid)]
    for flow in table.flows():
        kept += [*flow.cids, *flow.client_dcids, flow.client_scid]
    return kept + list(table._by_cid)


class _BugCatcher(logging.Handler):
    """Records the edge's "unexpected error" lines: its guard keeps a bug from raising, not from being one."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


@functools.cache
def _bug_catcher() -> _BugCatcher:
    catcher = _BugCatcher()
    logging.getLogger("router.udp_router").addHandler(catcher)
    return catcher


def _logged_bugs() -> int:
    catcher = _bug_catcher()
    count, catcher.count = catcher.count, 0
    return count


def run_quic_lb_cid(data: bytes) -> str:
    """``routable_cid`` then ``server_id`` on one datagram (``data[1:]``; ``data[0]``, if 1 to 20, is
    ``--quic-cid-length``, else the length is self-encoded): None, or a connection ID of 1 to 20
    octets where the datagram holds it (a short header's at 1, of the configured length; a
    Handshake packet's at 6), whose server ID of any length is the octets after its first."""
    if not data:
        return "empty"
    configured = data[0] if 1 <= data[0] <= MAX_CID_LENGTH else None
    datagram = data[1:]
    cid = routable_cid(datagram, configured)
    if cid is None:
        return "none"
    check(0 < len(cid) <= MAX_CID_LENGTH, f"a connection ID of {len(cid)} octets")
    long = bool(datagram[0] & 0x80)
    at = 6 if long else 1
    check(datagram[at : at + len(cid)] == cid, "a connection ID that is not where the datagram holds it")
    check(long or configured is None or len(cid) == configured, "a short header's DCID not of the configured length")
    for n in range(1, MAX_SERVER_ID_BYTES + 1):
        sid = server_id(cid, n)
        check(sid is None or sid == cid[1 : 1 + n], f"a server ID of {n} octets that is not the CID's")
    return f"{'long' if long else 'short'}-{'configured' if configured else 'self-encoded'}-{len(cid)}"


def quic_lb_cid_seeds() -> list[bytes]:
    """Short headers whose first octet self-encodes 8, 12, 20, 21 and 32 octets, the same cut at a
    configured length, and Handshake, Initial and unknown-version long headers with DCIDs of 8 to 255."""
    sid = b"\x7f\x00\x00\x02"
    seeds = []
    for length in (8, 12, MAX_CID_LENGTH, MAX_CID_LENGTH + 1, 32):
        short = b"\x40" + bytes([(length - 1) & 0x1F]) + sid + bytes(range(length - 5)) + bytes(30)
        seeds += [b"\x00" + short, bytes([min(length, MAX_CID_LENGTH)]) + short]
    for length in (8, MAX_CID_LENGTH, MAX_CID_LENGTH + 1, 32, 255):
        dcid = bytes([0x0B]) + sid + bytes(length - 5)
        for first, version in ((0xE0, QUIC_V1), (0xC0, QUIC_V1), (0xD0, QUIC_V2), (0xE0, 0x1A2A3A4A)):
            head = bytes([first]) + version.to_bytes(4, "big") + bytes([length]) + dcid + b"\x08" + bytes(8)
            seeds.append(b"\x00" + head + b"\x40\x20" + bytes(32))
    return seeds


def join(datagrams: Sequence[bytes]) -> bytes:
    """Datagrams as one input of a multi-datagram target."""
    return SEPARATOR.join(datagrams)


def sniffer_datagram_seeds() -> list[bytes]:
    seeds = [join(first_flight()), join(first_flight(version=QUIC_V2)), join(first_flight(None)),
             join(first_flight(big=True))]
    big = first_flight(big=True)
    seeds += [join(rewrite_flight(big, case, random.Random(case))) for case in sorted(CASES)]
    return seeds


def payload_seeds() -> list[bytes]:
    """Decrypted first flights as frames, plus the other frames an Initial may carry."""
    hello = quic_hellos()[0]
    big_hello = quic_hellos()[1]
    rng = random.Random(7)
    pieces = [crypto_frame(o, big_hello[o : o + 40]) for o in range(0, len(big_hello), 40)]
    rng.shuffle(pieces)
    ack = b"\x02" + encode_varint(5) + encode_varint(100) + encode_varint(1) + encode_varint(2) + b"\x01\x01"
    ack_ecn = b"\x03\x05\x00\x00\x01\x00\x00\x00"
    close = b"\x1c" + encode_varint(0x0A) + b"\x06" + encode_varint(4) + b"oops"
    third = len(big_hello) // 3
    return [
        b"\x00" + crypto_frame(0, hello),
        b"\x01" + crypto_frame(0, hello),
        b"\x06" + b"\x01" + ack + crypto_frame(0, hello[:200]) + b"\x00\x00\x01" + crypto_frame(200, hello[200:]),
        b"\x00" + SEPARATOR.join(b"".join(pieces[i::3]) for i in range(3)),
        b"\x00" + SEPARATOR.join(crypto_frame(o, big_hello[o : o + third]) for o in range(0, len(big_hello), third)),
        b"\x00" + close + ack_ecn + crypto_frame(0, hello),
        b"\x00" + crypto_frame(0, hello[:300]) + crypto_frame(100, hello[100:]),  # overlapping
    ]


def frames_seeds() -> list[bytes]:
    return [part for seed in payload_seeds() for part in seed[1:].split(SEPARATOR)]


def initial_native_seeds() -> list[bytes]:
    return frames_seeds() + corpus("initial_native")


def long_header_native_seeds() -> list[bytes]:
    return sniffer_datagram_seeds() + corpus("long_header_native")


def first_initial_native_seeds() -> list[bytes]:
    return payload_seeds() + corpus("first_initial_native")


def udp_router_seeds() -> list[bytes]:
    probe = b"\xc0\x1a\x2a\x3a\x4a\x08" + bytes(8) + b"\x08" + bytes(range(8))
    unknown = first_flight("nobody.example.com")
    next_client = SEPARATOR + SEPARATOR
    quic_lb_short = b"\x40\x08\x7f\x00\x00\x01" + bytes(4) + bytes(30)  # QUIC-LB: server ID 127.0.0.1
    over_long = b"\x40\x1f\x7f\x00\x00\x01" + bytes(27) + bytes(40)  # self-encodes 32 octets: names no pod
    handshake_over_long = b"\xe0\x00\x00\x00\x01\x20\x08\x7f\x00\x00\x01" + bytes(27) + b"\x00\x40\x40" + bytes(64)
    return [
        join([over_long, quic_lb_short, over_long, handshake_over_long]),
        join(unknown + unknown + unknown),
        join(first_flight(None)) + next_client + join(first_flight("stargate-0.stargate.external", QUIC_V2)),
        join([probe.ljust(1200, b"\x00"), b"\x40" + bytes(40), unknown[0][:1100], b"\xff\x00"]),
        join(rewrite_flight(first_flight("nobody.example.com", big=True), "chaos_spread", random.Random(1))),
        join(first_flight("x" * 300 + ".stargate.external", big=True)),
        join([quic_lb_short, quic_lb_short, b"\x40\xe8" + bytes(40), b"\x40\x08\x7f\x00\x00\x09" + bytes(30)]),
    ]


QUIC_DICTIONARY = (
    SEPARATOR, b"\xc0\x00\x00\x00\x01", b"\xd0\x6b\x33\x43\xcf", b"\x06\x00", b"\x06\x40\x00", b"\x02\x00\x00\x00\x00",
    b"\x1c\x00\x00\x00", b"\x01", b"\x00" * 8, b"\x80\x00\x00\x00", b"\xc0\x00\x00\x00\x00\x00\x00\x00",
    b"\x3f\xff\xff\xff", b"\x08" + FUZZ_DCID, b"\x44\xd0",
)


def _crypto_frames(hello: bytes, rng: random.Random) -> list[bytes]:
    """The hello as CRYPTO frames: whole, in order, shuffled, or overlapping, with PING/PADDING noise."""
    size = rng.choice((len(hello) or 1, 1, 7, 40, 300))
    frames = [crypto_frame(o, hello[o : o + size]) for o in range(0, len(hello), size)]
    if rng.random() < 0.5:
        rng.shuffle(frames)
    if rng.random() < 0.2 and hello:
        start = rng.randrange(len(hello))
        frames.insert(rng.randrange(len(frames) + 1), crypto_frame(start, hello[start : start + 50]))
    return [f + rng.choice((b"", b"", b"\x01", b"\x00\x00")) for f in frames]


def mutate_payload_input(data: bytes, rng: random.Random) -> bytes | None:
    """A mutated ClientHello as CRYPTO frames over 1-3 Initials (the sniffer payload format)."""
    hello = mutate_hello(rng.choice(hellos()), rng)
    if hello is None:
        return None
    frames = _crypto_frames(hello, rng)
    parts = rng.choice((1, 1, 2, 3))
    return bytes((rng.randrange(8),)) + SEPARATOR.join(b"".join(frames[i::parts]) for i in range(parts))


def mutate_first_payload_input(data: bytes, rng: random.Random) -> bytes | None:
    """The payload format's structured mutations: whole mutated hellos, or lying frames (half each)."""
    return mutate_payload_input(data, rng) if rng.random() < 0.5 else mutate_first_payloads(data, rng)


def protect_flight(hello: bytes, rng: random.Random) -> list[bytes]:
    """A client first flight carrying ``hello`` under a random DCID: real packet protection."""
    version = rng.choice((QUIC_V1, QUIC_V2))
    dcid = rng.randbytes(rng.choice((0, 8, 8, 20)))
    keys = client_initial_keys(version, dcid)
    frames = _crypto_frames(hello, rng)
    parts = rng.choice((1, 1, 2, 3))
    out = []
    for number in range(parts):
        payload = b"".join(frames[number::parts])
        payload += bytes(max(0, 1162 - len(payload)))
        out.append(encrypt_initial(version, dcid, FUZZ_SCID, number, payload, keys))
    return out


def mutate_router_input(data: bytes, rng: random.Random) -> bytes | None:
    """1-3 clients, each a real or rebuilt first flight, duplicated, cut, reordered or padded with junk."""
    clients = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.4:
            flight = first_flight(rng.choice(("nobody.example.com", "stargate-0.stargate.external", None)),
                             rng.choice((QUIC_V1, QUIC_V2)), big=rng.random() < 0.3)
        else:
            flight = protect_flight(mutate_hello(rng.choice(hellos()), rng) or b"", rng)
        for _ in range(rng.randint(0, 3) if flight else 0):
            roll, at = rng.random(), rng.randrange(len(flight))
            if roll < 0.3:
                flight.insert(at, flight[at])
            elif roll < 0.5:
                flight[at] = flight[at][: rng.randrange(len(flight[at]) + 1)]
            elif roll < 0.7:
                rng.shuffle(flight)
            else:
                flight.insert(at, bytes((0x40 | rng.randrange(64),)) + rng.randbytes(rng.randint(0, 60)))
        clients.append(SEPARATOR.join(d for d in flight if d))
    return (SEPARATOR * 2).join(clients)


QUIC_TARGETS = (
    FuzzTarget("initial_frames", run_initial_frames, (QuicPacketError,), frames_seeds, 20_000, QUIC_DICTIONARY),
    FuzzTarget("initial_native", run_initial_native, (), initial_native_seeds, 20_000, QUIC_DICTIONARY,
               mutate_frames, reaches_c=True),
    FuzzTarget("long_header_native", run_long_header_native, (), long_header_native_seeds, 20_000, QUIC_DICTIONARY,
               mutate_long_headers, reaches_c=True),
    FuzzTarget("sniffer_payloads", run_sniffer_payloads, (QuicPacketError,), payload_seeds, 20_000,
               QUIC_DICTIONARY, mutate_payload_input, reaches_c=True),
    FuzzTarget("first_initial_native", run_first_initial_native, (), first_initial_native_seeds, 20_000,
               QUIC_DICTIONARY, mutate_first_payload_input, reaches_c=True),
    FuzzTarget("sniffer_datagrams", run_sniffer_datagrams, (QuicPacketError,), sniffer_datagram_seeds,
               40_000, QUIC_DICTIONARY, reaches_c=True),
    FuzzTarget("udp_router", run_udp_router, (), udp_router_seeds, 40_000, QUIC_DICTIONARY, mutate_router_input,
               reaches_c=True),
    FuzzTarget("quic_lb_cid", run_quic_lb_cid, (), quic_lb_cid_seeds, 400, QUIC_DICTIONARY),
)

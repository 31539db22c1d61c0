"""Fuzz targets: every parser that reads untrusted bytes, with real seeds and its one allowed error.

Shared by ``tests/fuzz/run_fuzz.py`` (the mutation fuzzer, run by hand, not in CI) and
``tests/fuzz/test_fuzz_regressions.py`` (every saved crash input, replayed in CI). A target
turns bytes into calls of one parser; only that parser's own error type may escape. Any
other exception, or a broken invariant (``FuzzInvariantError``), is a crash. Seeds come
from real clients: ``ssl`` ClientHellos, ``h2`` client streams, aioquic first flights
(whole protected datagrams, and their decrypted frames re-encrypted so that mutations reach
the frame parser), and EndpointSlice documents from ``router/demo.py``.

=================  ===========================================================  =================
target             what runs (and the invariant checked besides "no other error")  allowed error
=================  ===========================================================  =================
clienthello        ``quic.clienthello.parse_client_hello``, then the hostname match  ClientHelloError
tls_peek           ``ClientHelloReader.feed``, whole and chunked must agree          TlsPeekError
h2_request         ``H2RequestReader.feed``, whole and chunked must agree            H2PeekError
settings_ack       ``SettingsAckStripper.feed``: input minus exactly one ACK out     H2PeekError
initial_frames     ``walk_initial_frames`` into a ``CryptoReassembler``              QuicPacketError
sniffer_payloads   ``InitialSniffer.feed`` on re-encrypted mutated frames            QuicPacketError
sniffer_datagrams  ``InitialSniffer.feed`` on mutated protected datagrams            QuicPacketError
udp_router         ``UdpRouter``'s datagram path (no sockets): answers never         (none)
                   larger than their datagram, pending flows within their bound
endpoints          ``parse_endpoints_document`` then ``targets_from_slices``         EndpointSliceError
=================  ===========================================================  =================

Input conventions: multi-datagram targets split their input on ``SEPARATOR`` (for
``udp_router`` an empty part hands over to the next client address); the QUIC payload
target's first byte picks the version and packet number length.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import random
import ssl
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hpack
import yaml
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from discovery.constants import SERVICE_NAME_LABEL
from discovery.endpoint_slices import EndpointSliceError, parse_endpoints_document, targets_from_slices
from discovery.settings import DiscoverySettings
from discovery.targets import Target, TargetSnapshot
from quic.clienthello import ClientHelloError, parse_client_hello
from quic.frames import CryptoReassembler, walk_initial_frames
from quic.initial_keys import client_initial_keys, encrypt_initial
from quic.initial_sniffer import InitialSniffer
from quic.packet import QUIC_V1, QUIC_V2, QuicPacketError, encode_varint
from router import constants as c
from router.demo.command import endpoint_slice, endpoints_document
from router.hostname import HostnameTemplate
from router.metrics import RouterMetrics
from router.tcp.h2c_peek import H2PeekError, H2RequestReader, SettingsAckStripper
from router.tcp.tls_peek import ClientHelloReader, TlsPeekError
from router.udp.edge import UdpRouter
from router.udp.settings import UdpRouterSettings
from tests.quic_initial_rewriter import CASES, crypto_frame, open_flight, rewrite_flight

SEPARATOR = b"\xfe\xfd\xfc\xfb"
"""Splits one fuzz input into several datagrams / payloads (rare in real traffic)."""
CORPUS_DIR = Path(__file__).parent / "corpus"
CRASHES_DIR = Path(__file__).parent / "crashes"
TEMPLATE = HostnameTemplate.parse(c.DEFAULT_ADVERTISED_HOSTNAME_TEMPLATE, "demo")
DISCOVERY = DiscoverySettings(
    "demo", c.DEFAULT_TARGET_SERVICE_NAME, c.DEFAULT_GRPC_PORT_NAME, c.DEFAULT_QUIC_PORT_NAME,
)
FUZZ_DCID = bytes.fromhex("8394c8f03e515708")
"""The client DCID of RFC 9001 appendix A: any fixed value works, the keys follow from it."""
FUZZ_SCID = bytes.fromhex("c0ffee00c0ffee00")
MAX_DATAGRAMS = 16


class FuzzInvariantError(AssertionError):
    """A parser returned without error but broke one of its promises: a crash too."""


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise FuzzInvariantError(what)


@dataclass(frozen=True)
class FuzzTarget:
    """One parser under fuzzing: how to run an input, what may escape, where to start."""

    name: str
    run: Callable[[bytes], str]
    """Runs one input; returns a short outcome label (new labels grow the corpus)."""
    allowed: tuple[type[BaseException], ...]
    seeds: Callable[[], list[bytes]]
    max_len: int
    dictionary: tuple[bytes, ...] = ()
    structured: Callable[[bytes, random.Random], bytes | None] | None = None
    """Optional structure-aware mutator (parse, change a node, re-serialise)."""


def _pieces(data: bytes) -> list[bytes]:
    """``data`` cut at points derived from its own bytes, so a crash replays exactly."""
    rng = random.Random(zlib.crc32(data))
    out, pos = [], 0
    while pos < len(data):
        step = rng.choice((1, 2, 3, 5, 9, 17, 64, 300, 4096))
        out.append(data[pos : pos + step])
        pos += step
    return out


# ---------------------------------------------------------------------------
# TLS: ClientHello walker and record-layer reader
# ---------------------------------------------------------------------------
def run_client_hello(data: bytes) -> str:
    info = parse_client_hello(data)
    _check(info.server_name is None or isinstance(info.server_name, str), "server_name type")
    _check(all(isinstance(p, str) and p for p in info.alpn), "alpn entries")
    if info.server_name is not None:
        TEMPLATE.pod_name_for(info.server_name)  # what the router does next: must not raise
    return "sni" if info.server_name else "no-sni"


def _feed_all(reader: Any, pieces: Sequence[bytes], error: type[Exception]) -> tuple[object, ...]:
    result: object = None
    try:
        for piece in pieces:
            result = reader.feed(piece)
    except error as exc:
        return ("error", exc)
    return ("done", result)


def run_tls_peek(data: bytes) -> str:
    """Whole and byte-chunked feeds must agree: the reader promises chunking does not matter."""
    whole = _feed_all(ClientHelloReader(), [data], TlsPeekError)
    chunked = _feed_all(ClientHelloReader(), _pieces(data), TlsPeekError)
    _check(whole[0] == chunked[0], f"whole feed {whole[0]} but chunked feed {chunked[0]}")
    if whole[0] == "error":
        raise whole[1]  # type: ignore[misc]
    _check(whole[1] == chunked[1], "chunked feed found another ClientHello")
    info = whole[1]
    if info is not None and info.server_name:  # type: ignore[attr-defined]
        TEMPLATE.pod_name_for(info.server_name)  # type: ignore[attr-defined]
    return "hello" if info is not None else "incomplete"


def _ssl_records(server_name: str | None, alpn: Sequence[str] = (), tls12: bool = False) -> bytes:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def _records(handshake: bytes, sizes: Sequence[int]) -> bytes:
    """``handshake`` fragmented into handshake records of the given sizes, then of 16 KiB."""
    out, pos = bytearray(), 0
    sizes = list(sizes)
    while pos < len(handshake) or not out:
        end = min(len(handshake), pos + (sizes.pop(0) if sizes else 2**14))
        fragment = handshake[pos:end]
        out += b"\x16\x03\x01" + len(fragment).to_bytes(2, "big") + fragment
        pos = end
    return bytes(out)


@functools.cache
def _tls_record_seeds() -> tuple[bytes, ...]:
    return (
        _ssl_records("stargate-0.stargate.external"),
        _ssl_records("stargate-1.stargate.external", ("h2", "grpc-exp")),
        _ssl_records(None, ("h2",)),
        _ssl_records("a" * 63 + ".stargate.external:443", tls12=True),
        _ssl_records("x.y", ("p" * 255,) * 3),
    )


@functools.cache
def _quic_hellos() -> tuple[bytes, ...]:
    return tuple(open_flight(flight).crypto for flight in (_flight(), _flight(big=True)))


def client_hello_seeds() -> list[bytes]:
    minimal = b"\x03\x03" + bytes(32) + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    return [r[5:] for r in _tls_record_seeds()] + list(_quic_hellos()) + [
        b"\x01" + len(minimal).to_bytes(3, "big") + minimal
    ]


def tls_peek_seeds() -> list[bytes]:
    seeds = list(_tls_record_seeds())
    hello = _tls_record_seeds()[1][5:]
    seeds += [_records(hello, (1, 7, 100, 5000)), _records(hello, (3,) * 4 + (4096,))]
    seeds.append(seeds[0] + b"\x17\x03\x03\x00\x05hello")  # application data after the hello
    return seeds


TLS_DICTIONARY = (
    b"\x16\x03\x01", b"\x16\x03\x03", b"\x00\x00", b"\x00\x10", b"\x00\x2b", b"\xff\xff", b"\x40\x00",
    b"\x01\x00\x00", b"\x00\x00\x00\x00", b"h2", b"stargate-0.stargate.external",
)


# ---------------------------------------------------------------------------
# h2c: first request reader and SETTINGS ACK stripper
# ---------------------------------------------------------------------------
def run_h2_request(data: bytes) -> str:
    whole = _feed_all(H2RequestReader(), [data], H2PeekError)
    chunked = _feed_all(H2RequestReader(), _pieces(data), H2PeekError)
    _check(whole[0] == chunked[0], f"whole feed {whole[0]} but chunked feed {chunked[0]}")
    if whole[0] == "error":
        raise whole[1]  # type: ignore[misc]
    _check(whole[1] == chunked[1], "chunked feed found another request")
    request = whole[1]
    if request is None:
        return "incomplete"
    authority = request.authority  # type: ignore[attr-defined]
    _check(authority is None or isinstance(authority, str), "authority type")
    if authority:
        TEMPLATE.pod_name_for(authority)
    return "request"


def _strip(pieces: Sequence[bytes]) -> tuple[bytes, bool, H2PeekError | None]:
    stripper = SettingsAckStripper()
    out = []
    try:
        for piece in pieces:
            out.append(stripper.feed(piece))
    except H2PeekError as exc:
        return b"".join(out), stripper.done, exc
    return b"".join(out), stripper.done, None


def run_settings_ack(data: bytes) -> str:
    """Forwarded bytes are the input minus exactly one empty SETTINGS ACK, however chunked."""
    out, done, error = _strip([data])
    chunked_out, chunked_done, chunked_error = _strip(_pieces(data))
    _check((error is None) == (chunked_error is None), "chunking changed whether the stream is malformed")
    if error is not None:
        raise error
    _check((out, done) == (chunked_out, chunked_done), "chunking changed the forwarded bytes")
    if not done:
        _check(data.startswith(out) and len(data) - len(out) < 9, "bytes lost before the ACK")
        return "passing"
    _check(len(out) == len(data) - 9, "not exactly one 9-byte frame removed")
    first_diff = next((i for i, (a, b) in enumerate(zip(out, data, strict=False)) if a != b), len(out))
    _check(
        any(_is_settings_ack(data[i : i + 9]) and data[:i] + data[i + 9 :] == out
            for i in range(max(0, first_diff - 9), first_diff + 1)),
        "the removed bytes are not a SETTINGS ACK",
    )
    return "stripped"


def _is_settings_ack(header: bytes) -> bool:
    """Empty SETTINGS with ACK on stream 0; other flags and the reserved bit are ignored (RFC 9113 4.1)."""
    return (len(header) == 9 and header[:4] == b"\x00\x00\x00\x04" and bool(header[4] & 1)
            and int.from_bytes(header[5:9], "big") & 0x7FFF_FFFF == 0)


def _frame(frame_type: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((frame_type, flags)) + stream_id.to_bytes(4, "big") + payload


GRPC_HEADERS = [
    (":method", "POST"), (":scheme", "http"), (":path", "/stargate.Stargate/Whoami"),
    (":authority", "stargate-0.stargate.external"), ("te", "trailers"),
    ("content-type", "application/grpc"), ("user-agent", "grpc-python/1.60"),
]


@functools.cache
def _h2_streams() -> tuple[bytes, ...]:
    import h2.config
    import h2.connection

    def client(headers: Sequence[tuple[str, str]], **kwargs: Any) -> bytes:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.increment_flow_control_window(1 << 20)
        conn.send_headers(1, headers, **kwargs)
        conn.send_data(1, b"\x00\x00\x00\x00\x02hi", end_stream=True)
        return conn.data_to_send()

    preface = c.H2_PREFACE
    settings = _frame(4, 0, 0, b"\x00\x02\x00\x00\x00\x00\x00\x04\x00\x40\x00\x00")
    ack = _frame(4, 1, 0)
    plain = hpack.Encoder().encode(GRPC_HEADERS, huffman=False)
    host_only = hpack.Encoder().encode([(":path", "/x"), ("host", "stargate-1.stargate.external:50071")])
    padded = bytes((5,)) + plain + bytes(5)
    prioritised = b"\x00\x00\x00\x03\x10" + plain
    third = len(plain) // 3
    continued = (
        _frame(1, 0, 1, plain[:third]) + _frame(9, 0, 1, plain[third : 2 * third])
        + _frame(9, 4, 1, plain[2 * third :])
    )
    return (
        client(GRPC_HEADERS),
        client(GRPC_HEADERS, priority_weight=200, priority_depends_on=0),
        client([(":method", "GET"), (":scheme", "http"), (":path", "/"),
                (":authority", "Stargate-0.Stargate.External.:443")]),
        preface + settings + _frame(8, 0, 0, b"\x00\x0f\x00\x01") + ack + _frame(1, 4, 1, plain),
        preface + settings + _frame(6, 0, 0, bytes(8)) + _frame(2, 0, 3, bytes(5)) + _frame(1, 0xC, 1, padded),
        preface + _frame(1, 0x24, 1, prioritised) + ack,
        preface + settings + continued + ack,
        preface + _frame(1, 5, 1, b"\x3f\xe1\x1f" + host_only),  # dynamic table size update first
        preface + ack + _frame(1, 4, 1, plain) + _frame(0, 1, 1, b"\x00\x00\x00\x00\x00"),
    )


def h2_seeds() -> list[bytes]:
    return list(_h2_streams())


H2_DICTIONARY = (
    c.H2_PREFACE, b"\x00\x00\x00\x04\x01\x00\x00\x00\x00", b"\x00\x00\x00\x04\x00\x00\x00\x00\x00",
    b"\x00\x40\x00", b"\x7f\xff\xff\xff", b"\x80\x00\x00\x01", b"\x01\x04", b"\x09\x04", b"\x3f\xe1\x1f",
    b"\x41", b"\x01", b"\x00\x0a:authority", b"\x04host", b"\xff\xff\xff\xff\x0f",
)


# ---------------------------------------------------------------------------
# QUIC: frames, the Initial sniffer, and the router's whole unrouted-datagram path
# ---------------------------------------------------------------------------
def run_initial_frames(data: bytes) -> str:
    crypto = CryptoReassembler()
    count = 0
    for offset, chunk in walk_initial_frames(data):
        _check(offset >= 0 and len(chunk) <= len(data), "CRYPTO frame out of its payload")
        crypto.add(offset, chunk)
        count += 1
    _check(len(crypto.contiguous()) == crypto.contiguous_length, "contiguous length")
    return f"crypto-frames-{min(count, 3)}"


def _sniff(datagrams: Sequence[bytes]) -> str:
    sniffer = InitialSniffer()
    for datagram in datagrams[:MAX_DATAGRAMS]:
        info = sniffer.feed(datagram)
        if info is not None:
            _check(sniffer.feed(datagram) is info, "a complete sniffer changed its answer")
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


class _Clock:
    """Stands in for the event loop: the router only asks it the time on this path."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def create_task(self, coro: Any, **_: Any) -> Any:
        coro.close()  # a routable name: the dial never runs, the flow stays pending (decided)
        return _NoTask()


class _NoTask:
    def add_done_callback(self, _: Any) -> None:
        pass


class _AnswerSink:
    """The listener transport: every answer must fit in the datagram being handled."""

    def __init__(self) -> None:
        self.provoking = 0

    def sendto(self, data: bytes, addr: Any = None) -> None:
        _check(0 < len(data) <= self.provoking, f"{len(data)}-byte answer to a {self.provoking}-byte datagram")

    def close(self) -> None:
        pass


@functools.cache
def _router() -> tuple[UdpRouter, _Clock, _AnswerSink]:
    snapshot = TargetSnapshot.of([Target("stargate-0", "127.0.0.1", 1, 9)])
    router = UdpRouter(UdpRouterSettings(max_pending_flows=8), TEMPLATE, lambda: snapshot, RouterMetrics())
    clock, sink = _Clock(), _AnswerSink()
    router._loop = clock  # type: ignore[assignment]
    router._transport = sink  # type: ignore[assignment]
    return router, clock, sink


def run_udp_router(data: bytes) -> str:
    """Datagrams from client addresses into a socket-less UdpRouter: nothing may raise,
    no answer may exceed the datagram that provoked it, pending flows stay bounded."""
    router, clock, sink = _router()
    router._table = type(router._table)(router.settings.flow_limits())
    router._dials.clear()
    port = 40000
    for datagram in data.split(SEPARATOR)[:MAX_DATAGRAMS]:
        if not datagram:  # an empty part (two separators in a row): the next client speaks
            port += 1
            continue
        clock.now += 0.25
        sink.provoking = len(datagram)
        router._from_client(datagram, ("127.0.0.9", port))
        router.sweep(clock.now)
        _check(router.pending_flows <= router.settings.max_pending_flows, "pending flows over the bound")
    return f"pending-{router.pending_flows}"


def _quic_config(server_name: str | None, version: int = QUIC_V1, big: bool = False) -> QuicConfiguration:
    from tests.quic_initial_rewriter import BIG_HELLO_ALPN

    config = QuicConfiguration(
        is_client=True, server_name=server_name, alpn_protocols=["stargate", *(BIG_HELLO_ALPN if big else ())],
        supported_versions=[version],
    )
    config.verify_mode = ssl.CERT_NONE
    return config


@functools.cache
def _flight_cached(server_name: str | None, version: int, big: bool) -> tuple[bytes, ...]:
    conn = QuicConnection(configuration=_quic_config(server_name, version, big))
    conn.connect(("127.0.0.1", 50072), now=0.0)
    return tuple(d for d, _ in conn.datagrams_to_send(now=0.0))


def _flight(server_name: str | None = "stargate-0.stargate.external", version: int = QUIC_V1,
            big: bool = False) -> list[bytes]:
    return list(_flight_cached(server_name, version, big))


def _join(datagrams: Sequence[bytes]) -> bytes:
    return SEPARATOR.join(datagrams)


def sniffer_datagram_seeds() -> list[bytes]:
    seeds = [_join(_flight()), _join(_flight(version=QUIC_V2)), _join(_flight(None)), _join(_flight(big=True))]
    big = _flight(big=True)
    seeds += [_join(rewrite_flight(big, case, random.Random(case))) for case in sorted(CASES)]
    return seeds


def payload_seeds() -> list[bytes]:
    """Decrypted first flights as frames, plus the other frames an Initial may carry."""
    hello = _quic_hellos()[0]
    big_hello = _quic_hellos()[1]
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


def udp_router_seeds() -> list[bytes]:
    probe = b"\xc0\x1a\x2a\x3a\x4a\x08" + bytes(8) + b"\x08" + bytes(range(8))
    unknown = _flight("nobody.example.com")
    next_client = SEPARATOR + SEPARATOR
    return [
        _join(unknown + unknown + unknown),
        _join(_flight(None)) + next_client + _join(_flight("stargate-0.stargate.external", QUIC_V2)),
        _join([probe.ljust(1200, b"\x00"), b"\x40" + bytes(40), unknown[0][:1100], b"\xff\x00"]),
        _join(rewrite_flight(_flight("nobody.example.com", big=True), "chaos_spread", random.Random(1))),
        _join(_flight("x" * 300 + ".stargate.external", big=True)),
    ]


QUIC_DICTIONARY = (
    SEPARATOR, b"\xc0\x00\x00\x00\x01", b"\xd0\x6b\x33\x43\xcf", b"\x06\x00", b"\x06\x40\x00", b"\x02\x00\x00\x00\x00",
    b"\x1c\x00\x00\x00", b"\x01", b"\x00" * 8, b"\x80\x00\x00\x00", b"\xc0\x00\x00\x00\x00\x00\x00\x00",
    b"\x3f\xff\xff\xff", b"\x08" + FUZZ_DCID, b"\x44\xd0",
)


# ---------------------------------------------------------------------------
# Discovery: EndpointSlice documents
# ---------------------------------------------------------------------------
def run_endpoints(data: bytes) -> str:
    slices = parse_endpoints_document(data.decode("utf-8", "replace"))
    snapshot = targets_from_slices(slices, DISCOVERY)
    for target in snapshot:
        _check(isinstance(target.pod_name, str) and target.pod_name != "", "pod name")
        _check(type(target.grpc_port) is int and 1 <= target.grpc_port <= 65535, "grpc port")
        _check(type(target.quic_port) is int and 1 <= target.quic_port <= 65535, "quic port")
        _check(isinstance(target.address, str), "address")
    return f"targets-{min(len(snapshot), 3)}"


def endpoints_seeds() -> list[bytes]:
    rows = [("stargate-0", "10.0.0.10", 50051, 50052), ("stargate-1", "fd00::11", 50051, 50052)]
    one = endpoint_slice(rows[:1])
    messy = json.loads(json.dumps(one))
    messy["endpoints"].append({"addresses": ["10.0.0.12"], "conditions": {"ready": False},
                               "targetRef": {"kind": "Pod", "name": "stargate-2"}})
    messy["endpoints"].append({"addresses": ["10.0.0.13"], "hostname": "stargate-3"})
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "stargate-headless"}}
    seeds = [
        endpoints_document(rows).encode(),
        json.dumps(one).encode(),
        yaml.safe_dump_all([service, one, messy]).encode(),
        yaml.safe_dump({"kind": "EndpointSliceList", "items": [one, messy]}).encode(),
        b"---\n...\n---\n" + yaml.safe_dump(one, default_flow_style=True).encode(),
    ]
    seeds += [path.read_bytes() for path in sorted(CORPUS_DIR.glob("endpoints*"))]
    return seeds


_VALUES: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 65535, 65536, 2**64, 1.5, "", "grpc", "quic", "TCP", "UDP", "Pod", "Service",
    "10.0.0.1", "::1", "fe80::1%eth0", "stargate-0", "stargate-headless", SERVICE_NAME_LABEL, [], {}, [{}],
    [[[]]], ["10.0.0.1", "10.0.0.2"], {"name": "grpc", "port": 1}, {"kind": None},
)
_KEYS = (
    "kind", "items", "metadata", "labels", "name", "ports", "port", "protocol", "endpoints", "addresses",
    "conditions", "ready", "serving", "terminating", "targetRef", "hostname", SERVICE_NAME_LABEL,
)


def _nodes(tree: Any, out: list[Any]) -> list[Any]:
    if isinstance(tree, dict | list):
        out.append(tree)
        for child in tree.values() if isinstance(tree, dict) else tree:
            _nodes(child, out)
    return out


def mutate_endpoints_tree(data: bytes, rng: random.Random) -> bytes | None:
    """Load, change nodes of the tree (value, key, type), dump as JSON or YAML; None if not YAML."""
    if len(data) > 8192:  # the pure-Python loader is slow on big parents: mutate those as bytes
        return None
    try:
        docs = [d for d in yaml.load_all(data.decode("utf-8", "replace"), Loader=yaml.SafeLoader)
                if d is not None]
    except Exception:
        return None
    containers = _nodes(docs, [])
    for _ in range(rng.randint(1, 4)):
        node = rng.choice(containers)
        value = rng.choice(_VALUES)
        value = copy.deepcopy(value)  # never share one object between places
        if isinstance(node, dict):
            key = rng.choice([*node.keys(), *_KEYS]) if node else rng.choice(_KEYS)
            if node and rng.random() < 0.2:
                node.pop(rng.choice(list(node.keys())), None)
            else:
                node[key] = value
        elif node:
            op = rng.random()
            if op < 0.3:
                node.append(copy.deepcopy(rng.choice(node)))
            elif op < 0.5:
                node.pop(rng.randrange(len(node)))
            else:
                node[rng.randrange(len(node))] = value
        else:
            node.append(value)
    try:
        if rng.random() < 0.5:
            text = json.dumps(docs[0] if len(docs) == 1 else {"kind": "List", "items": docs})
        else:
            text = yaml.safe_dump_all(docs, default_flow_style=rng.random() < 0.3)
    except (TypeError, ValueError, yaml.YAMLError):
        return None
    return text.encode()


YAML_DICTIONARY = (
    b"[", b"]", b"{", b"}", b": ", b"- ", b"\n", b"---\n", b"...\n", b"&a ", b"*a", b"!!binary ", b"!!timestamp ",
    b"!!python/object ", b"null", b"true", b"~", b"\"", b"'", b"1e309", b"0x1F", b".nan", b"<<: *a", b"? ",
    b"\t", b"#", b"%YAML 1.1\n", b"\\u0000", b"\xef\xbb\xbf", b"kind: List\n", b"items:\n",
)


# ---------------------------------------------------------------------------
# Structure-aware mutators: change one field, then fix every length around it, so that a
# mutation survives the outer length checks and reaches the code behind them.
# ---------------------------------------------------------------------------
NAMES = (
    b"stargate-0.stargate.external", b"STARGATE-1.Stargate.External.", b"stargate-0.stargate.external:50072",
    b"", b"\x00", b"\xff\xfe\x80", b"a" * 300, b"x.stargate-0.stargate.external", b"10.0.0.1", b"[::1]:443",
    b"stargate-0.stargate.external\x00.evil", "stargate-é.stargate.external".encode(), b".stargate.external",
    b"-.stargate.external", b"stargate-0..stargate.external", b"%s.stargate.external" % (b"b" * 64),
)


def _u16(n: int) -> bytes:
    return (n & 0xFFFF).to_bytes(2, "big")


def _tweak(data: bytes, rng: random.Random) -> bytes:
    """One small byte-level change (the engine's mutator does the heavy stacking)."""
    buf = bytearray(data)
    pos = rng.randrange(len(buf) + 1)
    roll = rng.random()
    if roll < 0.3 and buf:
        buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
    elif roll < 0.55:
        buf[pos:pos] = rng.randbytes(rng.randint(1, 8))
    elif roll < 0.8:
        del buf[pos : pos + rng.randint(1, 8)]
    elif len(buf) >= 2:
        at = rng.randrange(len(buf) - 1)
        buf[at : at + 2] = _u16(int.from_bytes(buf[at : at + 2], "big") + rng.choice((-2, -1, 1, 2, 0x8000)))
    return bytes(buf)


def hello_parts(hello: bytes) -> tuple[bytes, list[tuple[int, bytes]]] | None:
    """(fields before the extensions, [(type, body)]) of a ClientHello, or None if it does not walk."""
    try:
        pos = 4 + 2 + 32
        pos += 1 + hello[pos]
        pos += 2 + int.from_bytes(hello[pos : pos + 2], "big")
        pos += 1 + hello[pos]
    except IndexError:
        return None
    if pos + 2 > len(hello):
        return None
    extensions, at, end = [], pos + 2, min(len(hello), pos + 2 + int.from_bytes(hello[pos : pos + 2], "big"))
    while at + 4 <= end:
        size = int.from_bytes(hello[at + 2 : at + 4], "big")
        extensions.append((int.from_bytes(hello[at : at + 2], "big"), hello[at + 4 : at + 4 + size]))
        at += 4 + size
    return hello[4:pos], extensions


def build_hello(head: bytes, extensions: Sequence[tuple[int, bytes]]) -> bytes:
    block = b"".join(_u16(t) + _u16(len(b)) + b for t, b in extensions)
    body = head + _u16(len(block)) + block
    return b"\x01" + len(body).to_bytes(3, "big") + body


def mutate_hello(hello: bytes, rng: random.Random) -> bytes | None:
    """Change SNI/ALPN/extension list/head fields of a ClientHello and fix every length."""
    parts = hello_parts(hello)
    if parts is None:
        return None
    head, extensions = parts
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.25 and extensions:
            i = rng.randrange(len(extensions))
            extensions[i] = (extensions[i][0], _tweak(extensions[i][1], rng))
        elif roll < 0.45:
            names = b"".join(bytes((rng.choice((0, 0, 0, 1, 255)),)) + _u16(len(n)) + n
                             for n in rng.choices(NAMES, k=rng.choice((0, 1, 1, 1, 2, 3))))
            body = _u16(len(names) + rng.choice((0, 0, 0, 0, 1, -1))) + names
            _put_extension(extensions, 0, body, rng)
        elif roll < 0.6:
            protocols = b"".join(bytes((len(p),)) + p for p in rng.choices((b"h2", b"", b"grpc", b"x" * 255), k=2))
            _put_extension(extensions, 16, _u16(len(protocols) + rng.choice((0, 0, 0, 1))) + protocols, rng)
        elif roll < 0.7 and extensions:
            extensions.insert(rng.randrange(len(extensions) + 1), rng.choice(extensions))
        elif roll < 0.8 and extensions:
            extensions.pop(rng.randrange(len(extensions)))
        elif roll < 0.9:
            rng.shuffle(extensions)
        else:
            head = _tweak(head, rng)
    return build_hello(head, extensions)


def _put_extension(extensions: list[tuple[int, bytes]], ext_type: int, body: bytes, rng: random.Random) -> None:
    at = [i for i, (t, _) in enumerate(extensions) if t == ext_type]
    if at and rng.random() < 0.8:
        extensions[rng.choice(at)] = (ext_type, body)
    else:
        extensions.insert(rng.randrange(len(extensions) + 1), (ext_type, body))


def mutate_hello_input(data: bytes, rng: random.Random) -> bytes | None:
    return mutate_hello(data, rng)


def _record_payloads(records: bytes) -> bytes:
    out, pos = bytearray(), 0
    while pos + 5 <= len(records):
        size = int.from_bytes(records[pos + 3 : pos + 5], "big")
        out += records[pos + 5 : pos + 5 + size]
        pos += 5 + size
    return bytes(out)


def mutate_records(data: bytes, rng: random.Random) -> bytes | None:
    """Mutate the ClientHello inside the records, then fragment it again at random sizes."""
    hello = mutate_hello(_record_payloads(data), rng)
    if hello is None:
        return None
    sizes = [rng.choice((1, 2, 5, 64, 300, 16384)) for _ in range(rng.randint(1, 6))]
    return _records(hello, sizes) + (rng.randbytes(rng.randint(1, 20)) if rng.random() < 0.1 else b"")


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
    hello = mutate_hello(rng.choice(_hellos()), rng)
    if hello is None:
        return None
    frames = _crypto_frames(hello, rng)
    parts = rng.choice((1, 1, 2, 3))
    return bytes((rng.randrange(8),)) + SEPARATOR.join(b"".join(frames[i::parts]) for i in range(parts))


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
            flight = _flight(rng.choice(("nobody.example.com", "stargate-0.stargate.external", None)),
                             rng.choice((QUIC_V1, QUIC_V2)), big=rng.random() < 0.3)
        else:
            flight = protect_flight(mutate_hello(rng.choice(_hellos()), rng) or b"", rng)
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


@functools.cache
def _hellos() -> tuple[bytes, ...]:
    return tuple(client_hello_seeds())


_HEADER_POOL = (
    (":authority", "stargate-0.stargate.external"), (":authority", "STARGATE-1.stargate.external:50071"),
    (":authority", ""), (":authority", "x" * 300), ("host", "stargate-0.stargate.external"), (":path", "/"),
    (":path", "/stargate.StargateControlPlane/WatchStargates"), (":method", "POST"), (":scheme", "http"),
    ("te", "trailers"), ("content-type", "application/grpc"), ("x-big", "v" * 5000), ("", ""), (":authority", "\x00"),
)


def _h2_frames(data: bytes) -> list[tuple[int, int, int, bytes]] | None:
    if not data.startswith(c.H2_PREFACE):
        return None
    frames, pos = [], len(c.H2_PREFACE)
    while pos + 9 <= len(data):
        size = int.from_bytes(data[pos : pos + 3], "big")
        frames.append((data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5 : pos + 9], "big"),
                       data[pos + 9 : pos + 9 + size]))
        pos += 9 + size
    return frames


def mutate_h2(data: bytes, rng: random.Random) -> bytes | None:
    """Rewrite a header block (hpack), a frame's fields or the frame list, and fix frame lengths."""
    frames = _h2_frames(data)
    if frames is None:
        return None
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.35:
            headers = rng.sample(_HEADER_POOL, rng.randint(1, 6))
            block = hpack.Encoder().encode(headers, huffman=rng.random() < 0.5)
            if rng.random() < 0.2:
                block = rng.choice((b"\x20", b"\x3f\xe1\x1f", b"\x3f\xff\xff\xff\x0f")) + block
            flags = rng.choice((4, 5, 0x24, 0x0C, 0))
            payload = (bytes((3,)) + block + bytes(3)) if flags & 8 else block
            payload = (b"\x00\x00\x00\x00\x10" + payload) if flags & 0x20 else payload
            frames.insert(rng.randrange(len(frames) + 1), (1, flags, rng.choice((1, 1, 3, 2, 0)), payload))
            if not flags & 4:
                frames.insert(rng.randrange(len(frames) + 1), (9, 4, 1, hpack.Encoder().encode(headers[:1])))
        elif roll < 0.55 and frames:
            i = rng.randrange(len(frames))
            frame_type, flags, stream, payload = frames[i]
            frames[i] = (frame_type, flags, stream, _tweak(payload, rng))
        elif roll < 0.7 and frames:
            i = rng.randrange(len(frames))
            frame_type, flags, stream, payload = frames[i]
            field = rng.randrange(3)
            frames[i] = (
                rng.randrange(12) if field == 0 else frame_type,
                rng.randrange(256) if field == 1 else flags,
                rng.choice((0, 1, 2, 3, 0x8000_0001)) if field == 2 else stream,
                payload,
            )
        elif roll < 0.85:
            extra = rng.choice(((4, 1, 0, b""), (4, 0, 0, bytes(6)), (6, 0, 0, bytes(8)),
                                (8, 0, 0, b"\x00\x00\x10\x00"), (2, 0, 1, bytes(5)), (0, 1, 1, b"data"),
                                (0xEE, 0, 0, b"unknown")))
            frames.insert(rng.randrange(len(frames) + 1), extra)
        elif frames:
            i = rng.randrange(len(frames))
            if rng.random() < 0.5:
                frames.insert(i, frames[i])
            else:
                frames.pop(i)
    return c.H2_PREFACE + b"".join(_frame(t, f, s, p) for t, f, s, p in frames)


TARGETS: dict[str, FuzzTarget] = {
    t.name: t
    for t in (
        FuzzTarget("clienthello", run_client_hello, (ClientHelloError,), client_hello_seeds, 20_000, TLS_DICTIONARY,
                   mutate_hello_input),
        FuzzTarget("tls_peek", run_tls_peek, (TlsPeekError,), tls_peek_seeds, 20_000, TLS_DICTIONARY, mutate_records),
        FuzzTarget("h2_request", run_h2_request, (H2PeekError,), h2_seeds, 20_000, H2_DICTIONARY, mutate_h2),
        FuzzTarget("settings_ack", run_settings_ack, (H2PeekError,), h2_seeds, 8_000, H2_DICTIONARY, mutate_h2),
        FuzzTarget("initial_frames", run_initial_frames, (QuicPacketError,), frames_seeds, 20_000,
                   QUIC_DICTIONARY),
        FuzzTarget("sniffer_payloads", run_sniffer_payloads, (QuicPacketError,), payload_seeds, 20_000,
                   QUIC_DICTIONARY, mutate_payload_input),
        FuzzTarget("sniffer_datagrams", run_sniffer_datagrams, (QuicPacketError,), sniffer_datagram_seeds,
                   40_000, QUIC_DICTIONARY),
        FuzzTarget("udp_router", run_udp_router, (), udp_router_seeds, 40_000, QUIC_DICTIONARY, mutate_router_input),
        FuzzTarget("endpoints", run_endpoints, (EndpointSliceError,), endpoints_seeds, 65_536, YAML_DICTIONARY,
                   mutate_endpoints_tree),
    )
}
"""Every fuzz target by name (crash files are named ``<target>--<signature>--<hash>.bin``)."""


def replay(target_name: str, data: bytes) -> BaseException | None:
    """Run one input; the exception that should not have escaped, or None if it behaved."""
    target = TARGETS[target_name]
    try:
        target.run(data)
    except target.allowed:
        return None
    except Exception as exc:
        return exc
    return None

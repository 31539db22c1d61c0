"""The Initial sniffer against RFC vectors, real aioquic clients and rewritten hard flights."""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator, Sequence

import pytest
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from hypothesis import given, settings
from hypothesis import strategies as st

from quic.initial_sniffer import InitialSniffer, InvalidClientHello, NotInitial, ShortInitial
from quic.packet import QUIC_V1, QUIC_V2, QuicPacketError, UnsupportedVersion, encode_varint, parse_long_header
from router.demo.pki import DemoPki
from tests.support.initial_packets import protected_initial
from tests.support.quic_frames import ack, crypto_frame
from tests.support.quic_initial_rewriter import (
    ALPN,
    BIG_HELLO_ALPN,
    CASES,
    SERVER_NAME,
    client_first_flight,
    open_flight,
    rewrite_flight,
)
from tests.support.quic_readings import Native, both_readings
from tests.support.quic_vectors import RFC_CLIENT_HELLO, RFC_DCID, V1_CLIENT_INITIAL, V2_CLIENT_INITIAL
from wire.client_hello import ClientHelloError, ClientHelloInfo

VERSIONS = [QUIC_V1, QUIC_V2]
DCID = bytes.fromhex("0011223344556677")
SCID = bytes.fromhex("8899aabbccddeeff")
SERVER_ADDR = ("127.0.0.2", 50072)
CLIENT_ADDR = ("127.0.0.1", 40001)


RFC_HELLO = ClientHelloInfo("example.com", ("alpn",), 30_000)
"""What RFC 9001 Appendix A's ClientHello says (its transport parameters: max_idle_timeout 30 s)."""

initial = functools.partial(protected_initial, dcid=DCID, scid=SCID)
"""A client Initial carrying ``frames`` (this file's connection IDs unless told otherwise)."""


def feed_all(sniffer: InitialSniffer, datagrams: Sequence[bytes]) -> list[ClientHelloInfo | None]:
    return [sniffer.feed(d) for d in datagrams]


@both_readings
@pytest.mark.parametrize("packet", [V1_CLIENT_INITIAL, V2_CLIENT_INITIAL])
def test_rfc_client_initials(native: Native, packet: bytes) -> None:
    sniffer = InitialSniffer(native=native)
    assert sniffer.feed(packet) == RFC_HELLO
    assert sniffer.original_dcid == RFC_DCID and sniffer.client_scid == b""
    assert sniffer.version == (QUIC_V1 if packet is V1_CLIENT_INITIAL else QUIC_V2)


@both_readings
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("big_hello", [False, True])
def test_real_aioquic_client_first_flight(native: Native, version: int, big_hello: bool) -> None:
    _, datagrams = client_first_flight(version, alpn_protocols=("stargate", "h3"), big_hello=big_hello)
    assert len(datagrams) == (3 if big_hello else 1)
    sniffer = InitialSniffer(native=native)
    results = feed_all(sniffer, datagrams)
    assert results[:-1] == [None] * (len(datagrams) - 1)
    info = results[-1]
    assert info is not None and info.server_name == SERVER_NAME
    assert info.alpn == ("stargate", "h3") + (BIG_HELLO_ALPN if big_hello else ())
    flight = open_flight(datagrams)
    assert sniffer.version == version
    assert (sniffer.original_dcid, sniffer.client_scid) == (flight.dcid, flight.scid)


@both_readings
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("big_hello", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_sniffer_reads_every_rewritten_flight(native: Native, version: int, big_hello: bool, case: str) -> None:
    _, flight = client_first_flight(version, big_hello=big_hello)
    datagrams = rewrite_flight(flight, case, random.Random(f"{case}{version}{big_hello}"))
    sniffer = InitialSniffer(native=native)
    results = feed_all(sniffer, datagrams)
    first = next(i for i, r in enumerate(results) if r is not None)
    assert all(r is None for r in results[:first])
    assert all(r == results[first] for r in results[first:])  # later feeds repeat the answer
    expected = ClientHelloInfo(SERVER_NAME, ALPN + (BIG_HELLO_ALPN if big_hello else ()), 60_000)  # aioquic's default
    assert results[first] == expected
    assert sniffer.client_hello == results[first]


def _pump(client: QuicConnection, server: QuicConnection, first: Sequence[bytes]) -> bool:
    """Exchange datagrams (sans-IO) until both ends complete the handshake, or give up."""
    done: set[str] = set()
    to_server = list(first)
    now = 0.0
    for _ in range(8):
        now += 0.01
        for datagram in to_server:
            server.receive_datagram(datagram, CLIENT_ADDR, now)
        for datagram, _ in server.datagrams_to_send(now):
            client.receive_datagram(datagram, SERVER_ADDR, now)
        to_server = [d for d, _ in client.datagrams_to_send(now)]
        for name, connection in (("client", client), ("server", server)):
            for event in iter(connection.next_event, None):
                if isinstance(event, events.HandshakeCompleted):
                    done.add(name)
        if len(done) == 2:
            return True
    return False


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("big_hello", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_real_server_completes_exactly_the_documented_cases(
    pki: DemoPki, version: int, big_hello: bool, case: str
) -> None:
    ca = str(pki.ca_path)
    client, flight = client_first_flight(version, big_hello=big_hello, cafile=ca, addr=SERVER_ADDR)
    configuration = QuicConfiguration(is_client=False, alpn_protocols=[*ALPN], supported_versions=[version])
    configuration.load_cert_chain(pki.cert_path, pki.key_path)
    dcid = open_flight(flight).dcid
    server = QuicConnection(configuration=configuration, original_destination_connection_id=dcid)
    rewritten = rewrite_flight(flight, case, random.Random(case))
    assert _pump(client, server, rewritten) is CASES[case].server_completes


@both_readings
def test_second_half_first_and_dcid_of_another_flow_ignored(native: Native) -> None:
    hello = RFC_CLIENT_HELLO
    part1, part2 = initial(crypto_frame(0, hello[:100])), initial(crypto_frame(100, hello[100:]), pn=1)
    sniffer = InitialSniffer(native=native)
    assert sniffer.feed(part2) is None
    assert (sniffer.original_dcid, sniffer.client_scid, sniffer.version) == (DCID, SCID, QUIC_V1)
    other_flow = initial(crypto_frame(0, hello), dcid=b"another!")
    assert sniffer.feed(other_flow) is None  # a different DCID is not this flow's
    assert sniffer.feed(initial(crypto_frame(0, hello), version=QUIC_V2)) is None  # nor another version
    assert sniffer.feed(part1) == RFC_HELLO


@both_readings
def test_useless_datagrams_raise_only_before_the_first_initial(native: Native) -> None:
    hello = RFC_CLIENT_HELLO
    tampered = bytearray(initial(crypto_frame(0, hello[:50])))
    tampered[-3] ^= 0xFF
    short_header = b"\x41" + DCID + bytes(1200)
    cases: list[tuple[bytes, type[QuicPacketError]]] = [
        (short_header, NotInitial),
        (b"\xe0" + QUIC_V1.to_bytes(4, "big") + b"\x08" + DCID + b"\x00" + encode_varint(1100) + bytes(1100),
         NotInitial),  # a Handshake packet alone
        (initial(crypto_frame(0, hello[:50]), size=600), ShortInitial),
        (bytes(tampered), QuicPacketError),
        (b"\xc0" + bytes(4) + b"\x00\x00" + QUIC_V1.to_bytes(4, "big"), QuicPacketError),  # VN from a client
        (b"\xc0\x00", QuicPacketError),
    ]
    for datagram, error in cases:
        with pytest.raises(error):
            InitialSniffer(native=native).feed(datagram)
    sniffer = InitialSniffer(native=native)
    assert sniffer.feed(initial(crypto_frame(50, hello[50:]))) is None
    for datagram, _ in cases:
        assert sniffer.feed(datagram) is None
    assert sniffer.feed(initial(crypto_frame(0, hello[:50]), pn=1)) is not None


@both_readings
def test_unsupported_version_names_the_cids_for_version_negotiation(native: Native) -> None:
    datagram = b"\xc0" + (0x1A2A3A4A).to_bytes(4, "big") + b"\x04dcid\x04scid" + bytes(1200)
    with pytest.raises(UnsupportedVersion) as caught:
        InitialSniffer(native=native).feed(datagram)
    assert (caught.value.version, caught.value.dcid, caught.value.scid) == (0x1A2A3A4A, b"dcid", b"scid")


@both_readings
def test_coalesced_zero_rtt_and_trailing_junk_ignored(native: Native) -> None:
    zero_rtt = b"\xd0" + QUIC_V1.to_bytes(4, "big") + b"\x08" + DCID + b"\x08" + SCID + b"\x1e" + bytes(30)
    datagram = initial(crypto_frame(0, RFC_CLIENT_HELLO)) + zero_rtt + b"\x45junk"
    assert InitialSniffer(native=native).feed(datagram) == RFC_HELLO


@both_readings
def test_errors_inside_authenticated_initials_are_fatal(native: Native) -> None:
    hello = RFC_CLIENT_HELLO
    sniffer = InitialSniffer(native=native)
    sniffer.feed(initial(crypto_frame(100, hello[100:])))
    with pytest.raises(QuicPacketError, match="not allowed"):
        sniffer.feed(initial(b"\x08\x00\x01a", pn=1))  # a STREAM frame in an Initial
    with pytest.raises(QuicPacketError, match="conflicting"):
        sniffer.feed(initial(crypto_frame(100, b"X" + hello[101:]), pn=2))
    with pytest.raises(QuicPacketError, match="exceeds"):
        InitialSniffer(max_crypto_bytes=200, native=native).feed(initial(crypto_frame(0, hello)))


@both_readings
def test_a_crypto_stream_that_is_no_client_hello_is_invalid(native: Native) -> None:
    with pytest.raises(InvalidClientHello) as caught:
        InitialSniffer(native=native).feed(initial(crypto_frame(0, b"\x02\x00\x00\x04abcd")))  # a ServerHello type
    assert isinstance(caught.value, QuicPacketError) and isinstance(caught.value.__cause__, ClientHelloError)
    with pytest.raises(InvalidClientHello):
        InitialSniffer(native=native).feed(initial(crypto_frame(0, b"\x01\x00\x00\x04abcd")))  # truncated body


@both_readings
def test_chaos_pieces_with_ping_padding_and_acks_in_one_packet(native: Native) -> None:
    rng = random.Random(5)
    hello = RFC_CLIENT_HELLO
    frames = [crypto_frame(i, hello[i : i + 7]) + rng.choice([b"\x01", b"\x00\x00", ack(0)])
              for i in range(0, len(hello), 7)]
    rng.shuffle(frames)
    assert InitialSniffer(native=native).feed(initial(b"".join(frames))) == RFC_HELLO


@both_readings
def test_retransmitted_initials_are_harmless(native: Native) -> None:
    first = initial(crypto_frame(0, RFC_CLIENT_HELLO[:120]))
    sniffer = InitialSniffer(native=native)
    assert feed_all(sniffer, [first, first, first]) == [None, None, None]
    retransmission = initial(crypto_frame(0, RFC_CLIENT_HELLO), pn=1)
    assert sniffer.feed(retransmission) == RFC_HELLO


def _hostile_datagrams() -> Iterator[st.SearchStrategy[bytes]]:
    hello = RFC_CLIENT_HELLO
    frame = st.one_of(
        st.builds(lambda o, n: crypto_frame(o, hello[o : o + n]), st.integers(0, len(hello)),
                  st.integers(0, 80)),
        st.builds(lambda o, d: crypto_frame(o, d), st.integers(0, 70_000), st.binary(max_size=30)),
        st.sampled_from([b"\x00", b"\x01", ack(2), b"\x1c\x00\x00\x00", b"\x1e", b"\x06\x80"]),
        st.binary(max_size=8),
    )
    yield st.lists(frame, max_size=10).map(lambda fs: initial(b"".join(fs)))
    yield st.binary(max_size=1300)
    yield st.binary(max_size=1300).map(lambda b: V1_CLIENT_INITIAL[:18] + b)


@both_readings
@settings(max_examples=300, deadline=None)
@given(datagrams=st.lists(st.one_of(*_hostile_datagrams()), min_size=1, max_size=4))
def test_fuzz_feed_raises_only_quic_packet_error(native: Native, datagrams: list[bytes]) -> None:
    sniffer = InitialSniffer(native=native)
    for datagram in datagrams:
        try:
            sniffer.feed(datagram)
        except QuicPacketError:
            return


def _outcome(sniffer: InitialSniffer, datagram: bytes, first: bool, native: Native) -> object:
    try:
        header = parse_long_header(datagram, 0, native) if first else None
    except QuicPacketError:
        header = None  # the edge never opens a flow on a header it could not parse
    try:
        return sniffer.feed(datagram, header)
    except QuicPacketError as exc:
        return type(exc), str(exc)


@both_readings
@settings(max_examples=200, deadline=None)
@given(datagrams=st.lists(st.one_of(*_hostile_datagrams()), min_size=1, max_size=4))
def test_a_first_header_parsed_by_the_caller_changes_nothing(native: Native, datagrams: list[bytes]) -> None:
    """The edge hands the sniffer the header it parsed to classify the datagram: same answers."""
    plain, given_header = InitialSniffer(native=native), InitialSniffer(native=native)
    for datagram in [*datagrams, V1_CLIENT_INITIAL]:
        assert _outcome(plain, datagram, False, native) == _outcome(given_header, datagram, True, native)
        assert (plain.version, plain.original_dcid, plain.client_scid) == (
            given_header.version, given_header.original_dcid, given_header.client_scid)

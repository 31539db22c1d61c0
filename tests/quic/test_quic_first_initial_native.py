"""A flow's first Initial read in one C call (``sniff_first``) leaves the sniffer exactly as the
reference path does: the same answer or error, the same version, DCIDs and packet number, and the
same reading of the datagrams that follow (a ClientHello spread over several Initials, damage,
coalesced packets, datagrams too short)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quic import native as quic_native
from quic.packet import QUIC_V1, QUIC_V2
from tests.support.initial_packets import protected_initial
from tests.support.initial_reference import c_sniffer_agrees
from tests.support.quic_frames import ack, crypto_frame
from tests.support.quic_initial_rewriter import client_first_flight
from tests.support.quic_vectors import RFC_CLIENT_HELLO, V1_CLIENT_INITIAL, V2_CLIENT_INITIAL

pytestmark = pytest.mark.skipif(quic_native.EXTENSION is None, reason="quic._initial_protection is not built")

HELLO = RFC_CLIENT_HELLO
"""The RFC 9001 A.2 ClientHello (example.com, ALPN "alpn")."""


agree = c_sniffer_agrees


@pytest.mark.parametrize("datagram", [V1_CLIENT_INITIAL, V2_CLIENT_INITIAL])
def test_the_rfc_initials(datagram: bytes) -> None:
    answers = agree([datagram])[0]
    assert isinstance(answers, tuple) and answers[0].server_name == "example.com"


@pytest.mark.parametrize("version", [QUIC_V1, QUIC_V2])
def test_a_real_client_first_flight(version: int) -> None:
    _, flight = client_first_flight(version)
    assert agree(flight)[1] == version


def test_a_big_hello_over_two_initials() -> None:
    _, flight = client_first_flight(big_hello=True)
    assert len(flight) >= 2
    answers = agree(flight)[0]
    assert isinstance(answers, tuple) and answers[0] is None and answers[-1] is not None


def _flights() -> st.SearchStrategy[list[bytes]]:
    """One or two client Initials carrying the hello in 1-3 CRYPTO pieces, damaged or not, with
    junk or another long header coalesced after the first, or cut short."""
    version = st.sampled_from([QUIC_V1, QUIC_V2])
    cut = st.integers(1, len(HELLO) - 1)
    dcid = st.binary(min_size=0, max_size=20)

    def build(version: int, cut: int, dcid: bytes, split: bool, extra: bytes, flips: list[tuple[int, int]],
              size: int, pn: int) -> list[bytes]:
        pieces = [crypto_frame(0, HELLO[:cut]), crypto_frame(cut, HELLO[cut:])] if split else [crypto_frame(0, HELLO)]
        first = bytearray(protected_initial(pieces[0] + ack(1), version=version, dcid=dcid, pn=pn, size=size))
        for at, xor in flips:
            first[at % len(first)] ^= xor
        datagrams = [bytes(first) + extra]
        if split:
            datagrams.append(protected_initial(pieces[1], version=version, dcid=dcid, pn=pn + 1))
        return datagrams

    return st.builds(
        build, version, cut, dcid, st.booleans(),
        st.one_of(st.just(b""), st.binary(max_size=30),
                  st.sampled_from([b"\xc0\x00\x00\x00\x01\x00\x00\x05hello", b"\x40junk"])),
        st.lists(st.tuples(st.integers(0, 1300), st.integers(1, 255)), max_size=2),
        st.sampled_from([1200, 1100, 1350]), st.integers(0, 2**20),
    )


@settings(max_examples=400, deadline=None)
@given(datagrams=_flights())
def test_whatever_the_first_datagram_the_one_call_answers_as_the_reference(datagrams: list[bytes]) -> None:
    agree(datagrams)


@pytest.mark.parametrize("datagram", [V1_CLIENT_INITIAL, V2_CLIENT_INITIAL], ids=["v1", "v2"])
def test_every_byte_value_of_the_first_48_bytes_reads_as_the_python_path(datagram: bytes) -> None:
    """The header's every field (first byte, version, CID lengths and CIDs, token and Length) and the
    first packet number bytes, each set to every value: the one-call C reading answers as Python."""
    for at in range(48):
        for value in range(256):
            agree([datagram[:at] + bytes((value,)) + datagram[at + 1 :]])


@pytest.mark.parametrize("datagram", [V1_CLIENT_INITIAL, V2_CLIENT_INITIAL], ids=["v1", "v2"])
def test_every_truncation_reads_as_the_python_path(datagram: bytes) -> None:
    for size in range(len(datagram) + 1):
        agree([datagram[:size]])

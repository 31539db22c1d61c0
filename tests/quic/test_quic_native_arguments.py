"""Every entry point of ``quic/_initial_protection.c`` checks its own arguments.

Today's Python callers check positions before they call (``decrypt_initial``, ``InitialSniffer``),
but the C must not depend on that: a position, length or limit outside what the datagram holds is
``QuicPacketError`` (``quic/``'s one error type), never a read past the buffer, and a limit the
caller gets wrong is refused rather than wrapped into a huge unsigned one.
"""

from __future__ import annotations

import pytest

from quic import native as quic_native
from quic.initial_keys import CLIENT_KEY_INPUTS, client_initial_keys, decrypt_initial
from quic.packet import QUIC_V1, QuicPacketError, parse_long_header
from tests.support.quic_frames import crypto_frame
from tests.support.quic_vectors import RFC_CLIENT_HELLO, V1_CLIENT_INITIAL

pytestmark = pytest.mark.skipif(quic_native.EXTENSION is None, reason="quic._initial_protection is not built")

KEY, IV, HP = bytes(16), bytes(12), bytes(16)
SALT, SECRET_INFO, KEY_INFO, IV_INFO, HP_INFO = CLIENT_KEY_INPUTS[QUIC_V1]
DCID = bytes.fromhex("8394c8f03e515708")
MAX = 16 * 1024


def extension() -> quic_native.InitialProtection:
    from quic import _initial_protection

    return _initial_protection


def sniff_first(datagram: bytes, pn_offset: int, end: int, max_crypto: int = MAX, max_hello: int = MAX,
                salt: bytes = SALT) -> object:
    return extension().sniff_first(datagram, salt, SECRET_INFO, KEY_INFO, IV_INFO, HP_INFO, DCID, pn_offset, end,
                                   max_crypto, max_hello)


def test_a_negative_end_is_a_quic_packet_error_not_a_read_past_the_datagram() -> None:
    """The call that read memory when ``pn_offset > end - 20`` wrapped (a SEGV under ASan)."""
    with pytest.raises(QuicPacketError):
        extension().open_initial(bytes(64), KEY, IV, HP, 0, 100000, -(2**63), -1)
    with pytest.raises(QuicPacketError):
        sniff_first(bytes(64), 20, -(2**63))
    with pytest.raises(QuicPacketError):
        sniff_first(bytes(64), 20, -1)


@pytest.mark.parametrize(("offset", "pn_offset", "end", "largest_pn"), [
    (-1, 20, 64, -1),  # before the datagram
    (0, 0, 64, -1),  # the packet number where the first byte is
    (30, 20, 64, -1),  # the packet number before the packet
    (0, 20, 65, -1),  # past the datagram's end
    (0, 45, 64, -1),  # no room for the packet number and the sample
    (0, 2**62, 64, -1),
    (0, 20, 2**63 - 1, -1),
    (0, 20, -20, -1),
    (0, 20, 64, -2),  # no packet number is below -1 ("none yet")
    (0, 20, 64, 2**62),  # nor at 2^62
])
def test_open_initial_refuses_positions_outside_the_datagram(offset: int, pn_offset: int, end: int,
                                                             largest_pn: int) -> None:
    with pytest.raises(QuicPacketError):
        extension().open_initial(bytes(64), KEY, IV, HP, offset, pn_offset, end, largest_pn)


@pytest.mark.parametrize(("key", "iv", "hp"), [(bytes(15), IV, HP), (KEY, bytes(16), HP), (KEY, IV, b"")])
def test_open_initial_refuses_keys_of_the_wrong_size(key: bytes, iv: bytes, hp: bytes) -> None:
    with pytest.raises(QuicPacketError):
        extension().open_initial(bytes(64), key, iv, hp, 0, 20, 64, -1)


@pytest.mark.parametrize(("pn_offset", "end"), [(0, 64), (-5, 64), (20, 65), (45, 64), (2**62, 64), (20, 2**63 - 1)])
def test_sniff_first_refuses_positions_outside_the_datagram(pn_offset: int, end: int) -> None:
    with pytest.raises(QuicPacketError):
        sniff_first(bytes(64), pn_offset, end)


def test_a_salt_longer_than_an_hmac_block_is_refused_not_a_libcrypto_failure() -> None:
    with pytest.raises(QuicPacketError):
        extension().initial_keys(bytes(65), DCID, SECRET_INFO, KEY_INFO, IV_INFO, HP_INFO)
    with pytest.raises(QuicPacketError):
        sniff_first(V1_CLIENT_INITIAL, 20, len(V1_CLIENT_INITIAL), salt=bytes(65))


@pytest.mark.parametrize(("max_crypto", "max_hello"), [(-1, MAX), (MAX, -1), (-(2**63), MAX)])
def test_a_negative_limit_is_refused_not_read_as_a_huge_one(max_crypto: int, max_hello: int) -> None:
    payload = crypto_frame(0, RFC_CLIENT_HELLO)
    with pytest.raises(QuicPacketError):
        extension().sniff_initial(payload, max_crypto, max_hello)
    header = parse_long_header(V1_CLIENT_INITIAL)
    with pytest.raises(QuicPacketError):
        sniff_first(V1_CLIENT_INITIAL, header.header_length, header.end, max_crypto, max_hello)
    if max_hello < 0:
        with pytest.raises(QuicPacketError):
            extension().client_hello_facts(RFC_CLIENT_HELLO, max_hello)


@pytest.mark.parametrize("offset", [-1, -(2**63), len(V1_CLIENT_INITIAL), 2**63 - 1])
def test_long_header_declines_an_offset_outside_the_datagram(offset: int) -> None:
    assert extension().long_header(V1_CLIENT_INITIAL, offset) is None


def test_the_checked_calls_still_open_the_rfc_initial() -> None:
    """The checks refuse only what lies: the RFC's Initial opens in C as in Python."""
    header = parse_long_header(V1_CLIENT_INITIAL)
    keys = client_initial_keys(header.version, header.dcid)
    packet_number, payload = decrypt_initial(V1_CLIENT_INITIAL, header, keys)
    assert packet_number == 2 and payload.startswith(b"\x06\x00")
    sniffed = sniff_first(V1_CLIENT_INITIAL, header.header_length, header.end)
    assert sniffed is not None and sniffed[1] == ("example.com", ("alpn",), 30_000)

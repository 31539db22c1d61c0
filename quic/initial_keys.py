"""Initial packet protection for QUIC v1 (RFC 9001 section 5) and v2 (RFC 9369 section 3.3).

Initial keys derive from public values (a per-version salt and the client's first DCID), so the
router can read the SNI without terminating QUIC, and answer a refused client as its server would.
Keys are derived per flow, never cached: a cache keyed by spoofable DCIDs would only churn. With
``native`` the client side runs in C (``quic/_initial_protection.c``); the Python here is the reference.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from quic.packet import (
    MAX_CID_LENGTH,
    QUIC_V1,
    QUIC_V2,
    LongHeader,
    PacketType,
    QuicPacketError,
    encode_varint,
    packet_type_bits,
)

if TYPE_CHECKING:
    from quic.native import InitialProtection

_SALTS = {
    QUIC_V1: bytes.fromhex("38762cf7f55934b34d179ae6a4c80cadccbb7f0a"),  # RFC 9001 section 5.2
    QUIC_V2: bytes.fromhex("0dede3def700a6db819381be6e269dcbf9bd2ed9"),  # RFC 9369 section 3.3.1
}
_LABELS = {  # RFC 9369 section 3.3.2 renames the v1 labels
    QUIC_V1: (b"quic key", b"quic iv", b"quic hp"),
    QUIC_V2: (b"quicv2 key", b"quicv2 iv", b"quicv2 hp"),
}
KEY_BYTES = 16
"""AES-128-GCM key (Initials always use TLS_AES_128_GCM_SHA256)."""
IV_BYTES = 12
TAG_BYTES = 16
"""AEAD expansion of every protected payload."""
SAMPLE_BYTES = 16
"""Header protection samples 16 ciphertext bytes, 4 bytes after the packet number start."""
MAX_PN_BYTES = 4
_SHA256_BYTES = hashlib.sha256().digest_size
"""HKDF-SHA256's block: the Initial secret's length, and the most one HKDF-Expand block gives."""
_PN_LIMIT = 1 << 62
"""RFC 9000 section 12.3: packet numbers are below 2^62."""


@dataclass(frozen=True, slots=True)
class InitialKeys:
    """Packet key, IV and header protection key of one direction's Initial space."""

    key: bytes
    iv: bytes
    hp: bytes


@functools.cache
def _expand_input(label: bytes, length: int) -> bytes:
    """HKDF-Expand's only HMAC input: the HkdfLabel (RFC 8446 section 7.1, empty context) and counter 1.
    One block: no Initial secret or key is longer than SHA-256's output (RFC 5869 section 2.3)."""
    if not 0 < length <= _SHA256_BYTES:
        raise ValueError(f"an Initial key is 1..{_SHA256_BYTES} bytes, not {length}")
    full = b"tls13 " + label
    return length.to_bytes(2, "big") + bytes((len(full),)) + full + b"\x00" + b"\x01"


def _sha256(data: bytes = b"") -> hashlib._Hash:
    """A Python-level SHA-256 constructor: with it ``hmac.HMAC`` keys its own (copyable) hashlib objects
    instead of OpenSSL's HMAC, which on OpenSSL 3 fetches the implementation on every call: most of a
    cold Initial key schedule's cost."""
    return hashlib.sha256(data)


_EXTRACTORS = {version: hmac.HMAC(salt, digestmod=_sha256) for version, salt in _SALTS.items()}
"""HKDF-Extract's HMAC keyed with each version's salt, copied per connection."""


def _expand_label(keyed: hmac.HMAC, label: bytes, length: int) -> bytes:
    """TLS 1.3 HKDF-Expand-Label with an empty context, from the secret's keyed HMAC (one block)."""
    mac = keyed.copy()
    mac.update(_expand_input(label, length))
    return mac.digest()[:length]


_NATIVE_INPUTS = {
    (version, direction): (
        _SALTS[version], _expand_input(direction, _SHA256_BYTES), _expand_input(key_label, KEY_BYTES),
        _expand_input(iv_label, IV_BYTES), _expand_input(hp_label, KEY_BYTES),
    )
    for version, (key_label, iv_label, hp_label) in _LABELS.items()
    for direction in (b"client in", b"server in")
}
"""The C key schedule's constant inputs per (version, direction): salt, then the HKDF-Expand inputs."""

CLIENT_KEY_INPUTS = {version: inputs for (version, direction), inputs in _NATIVE_INPUTS.items()
                     if direction == b"client in"}
"""The C key schedule's inputs of client Initials per version (``InitialSniffer``'s one-call first Initial)."""


def _initial_keys(
    version: int, original_dcid: bytes, direction: bytes, native: InitialProtection | None
) -> InitialKeys:
    if native is not None and version in _EXTRACTORS:
        salt, secret_info, key_info, iv_info, hp_info = _NATIVE_INPUTS[version, direction]
        key, iv, hp = native.initial_keys(salt, original_dcid, secret_info, key_info, iv_info, hp_info)
        return InitialKeys(key, iv, hp)
    return derive_initial_keys(version, original_dcid, direction)


def derive_initial_keys(version: int, original_dcid: bytes, direction: bytes) -> InitialKeys:
    """The Initial key schedule in Python (``direction``: ``b"client in"`` or ``b"server in"``), C's reference."""
    extractor = _EXTRACTORS.get(version)
    if extractor is None:
        raise QuicPacketError(f"no Initial keys for QUIC version 0x{version:08x}")
    key_label, iv_label, hp_label = _LABELS[version]
    extract = extractor.copy()
    extract.update(original_dcid)
    initial_secret = hmac.HMAC(extract.digest(), digestmod=_sha256)  # HKDF-Extract
    secret = hmac.HMAC(_expand_label(initial_secret, direction, _SHA256_BYTES), digestmod=_sha256)
    return InitialKeys(
        key=_expand_label(secret, key_label, KEY_BYTES),
        iv=_expand_label(secret, iv_label, IV_BYTES),
        hp=_expand_label(secret, hp_label, KEY_BYTES),
    )


def client_initial_keys(version: int, original_dcid: bytes, native: InitialProtection | None = None) -> InitialKeys:
    """Keys protecting client Initials (what the router decrypts); derived in C with ``native``."""
    return _initial_keys(version, original_dcid, b"client in", native)


def server_initial_keys(version: int, original_dcid: bytes, native: InitialProtection | None = None) -> InitialKeys:
    """Keys protecting server Initials (what the router encrypts a refusal with); in C with ``native``."""
    return _initial_keys(version, original_dcid, b"server in", native)


def _mask(hp: bytes, sample: bytes) -> bytes:
    encryptor = Cipher(algorithms.AES(hp), modes.ECB()).encryptor()
    return encryptor.update(sample)[:5]


def _nonce(iv: bytes, packet_number: int) -> bytes:
    return (int.from_bytes(iv, "big") ^ packet_number).to_bytes(IV_BYTES, "big")


def decode_packet_number(truncated: int, pn_bits: int, largest_pn: int) -> int:
    """Full packet number from its truncated encoding (RFC 9000 appendix A.3)."""
    expected = largest_pn + 1
    win = 1 << pn_bits
    hwin = win >> 1
    candidate = (expected & ~(win - 1)) | truncated
    if candidate <= expected - hwin and candidate < (1 << 62) - win:
        return candidate + win
    if candidate > expected + hwin and candidate >= win:
        return candidate - win
    return candidate


def decrypt_initial(
    datagram: bytes, header: LongHeader, keys: InitialKeys, largest_pn: int = -1,
    native: InitialProtection | None = None,
) -> tuple[int, bytes]:
    """(packet number, payload) of the Initial ``header`` locates; ``largest_pn``: the largest received
    so far (-1: none). Header-protection and AEAD failures raise QuicPacketError. In C with ``native``."""
    if native is None or not -1 <= largest_pn < _PN_LIMIT:
        return open_initial(datagram, header, keys, largest_pn)
    pn_offset, end = _sample_room(datagram, header)
    opened = native.open_initial(datagram, keys.key, keys.iv, keys.hp, header.offset, pn_offset, end, largest_pn)
    if opened is None:
        raise QuicPacketError("Initial packet failed authentication")
    return opened


def _sample_room(datagram: bytes, header: LongHeader) -> tuple[int, int]:
    """(packet number offset, end) of an Initial with room for its header protection sample."""
    if header.packet_type is not PacketType.INITIAL:
        raise QuicPacketError("not an Initial packet")
    pn_offset = header.header_length
    end = header.end
    if end > len(datagram) or pn_offset + MAX_PN_BYTES + SAMPLE_BYTES > end:
        raise QuicPacketError("Initial too short to sample for header protection")
    return pn_offset, end


def open_initial(datagram: bytes, header: LongHeader, keys: InitialKeys, largest_pn: int = -1) -> tuple[int, bytes]:
    """``decrypt_initial`` in Python (``cryptography``): the reference the C opening must agree with."""
    pn_offset, end = _sample_room(datagram, header)
    mask = _mask(keys.hp, datagram[pn_offset + MAX_PN_BYTES : pn_offset + MAX_PN_BYTES + SAMPLE_BYTES])
    first = datagram[header.offset] ^ (mask[0] & 0x0F)
    pn_length = (first & 0x03) + 1
    pn_field = datagram[pn_offset : pn_offset + pn_length]
    pn_bytes = bytes(b ^ m for b, m in zip(pn_field, mask[1:], strict=False))
    packet_number = decode_packet_number(int.from_bytes(pn_bytes, "big"), pn_length * 8, largest_pn)
    aad = bytes((first,)) + datagram[header.offset + 1 : pn_offset] + pn_bytes
    try:
        payload = AESGCM(keys.key).decrypt(
            _nonce(keys.iv, packet_number), datagram[pn_offset + pn_length : end], aad
        )
    except InvalidTag as exc:
        raise QuicPacketError("Initial packet failed authentication") from exc
    return packet_number, payload


def packet_number_length(packet_number: int) -> int:
    """Bytes to send ``packet_number`` with nothing acknowledged yet (RFC 9000 section 17.1)."""
    for size in (1, 2, 3, 4):
        if packet_number < 1 << (8 * size - 1):
            return size
    raise QuicPacketError(f"packet number {packet_number} needs more than 4 bytes")


def encrypt_initial(
    version: int,
    dcid: bytes,
    scid: bytes,
    packet_number: int,
    payload: bytes,
    keys: InitialKeys,
    token: bytes = b"",
    pn_length: int | None = None,
) -> bytes:
    """A protected Initial carrying ``payload`` (frames), padded only as far as header protection needs a
    sample (padding the datagram to 1200 bytes is the caller's); ``pn_length`` overrides the shortest."""
    if version not in _SALTS:
        raise QuicPacketError(f"no Initial packets for QUIC version 0x{version:08x}")
    if len(dcid) > MAX_CID_LENGTH or len(scid) > MAX_CID_LENGTH:
        raise QuicPacketError("connection ID longer than 20 bytes")
    if packet_number < 0:
        raise QuicPacketError("negative packet number")
    size = packet_number_length(packet_number) if pn_length is None else pn_length
    if not 1 <= size <= MAX_PN_BYTES or packet_number >= 1 << (8 * size):
        raise QuicPacketError(f"packet number {packet_number} does not fit {size} bytes")
    short = MAX_PN_BYTES - size - len(payload)
    if short > 0:
        payload += bytes(short)
    header = b"".join((
        bytes((0xC0 | packet_type_bits(version, PacketType.INITIAL) | (size - 1),)),
        version.to_bytes(4, "big"),
        bytes((len(dcid),)), dcid,
        bytes((len(scid),)), scid,
        encode_varint(len(token)), token,
        encode_varint(size + len(payload) + TAG_BYTES),
        packet_number.to_bytes(size, "big"),
    ))
    protected = AESGCM(keys.key).encrypt(_nonce(keys.iv, packet_number), payload, header)
    sample_at = MAX_PN_BYTES - size
    mask = _mask(keys.hp, protected[sample_at : sample_at + SAMPLE_BYTES])
    pn_offset = len(header) - size
    out = bytearray(header)
    out[0] ^= mask[0] & 0x0F
    for i in range(size):
        out[pn_offset + i] ^= mask[1 + i]
    out += protected
    return bytes(out)

"""Types of the optional C extension ``quic/_initial_protection.c``."""

ATTRIBUTES: tuple[tuple[str, str], ...]
"""(owner, name) of every Python attribute the C reads by name: ``quic.packet.QuicPacketError``, the
error every entry point raises for arguments outside the datagram (tests/test_c_attributes.py)."""

def initial_keys(
    salt: bytes, dcid: bytes, secret_info: bytes, key_info: bytes, iv_info: bytes, hp_info: bytes
) -> tuple[bytes, bytes, bytes]: ...
def open_initial(
    datagram: bytes, key: bytes, iv: bytes, hp: bytes, offset: int, pn_offset: int, end: int, largest_pn: int
) -> tuple[int, bytes] | None: ...
def sniff_initial(
    payload: bytes, max_crypto: int, max_hello: int
) -> tuple[str | None, tuple[str, ...], int] | None: ...
def sniff_first(
    datagram: bytes, salt: bytes, secret_info: bytes, key_info: bytes, iv_info: bytes, hp_info: bytes, dcid: bytes,
    pn_offset: int, end: int, max_crypto: int, max_hello: int,
) -> tuple[
    int, tuple[str | None, tuple[str, ...], int] | None, tuple[bytes, bytes, bytes, bytes] | None
] | None: ...
def client_hello_facts(handshake: bytes, max_hello: int) -> tuple[str | None, tuple[str, ...], int] | None: ...
def long_header(datagram: bytes, offset: int) -> tuple[int, int, bytes, bytes, bytes, int, int] | None: ...

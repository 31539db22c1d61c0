"""TLS record peek against real OpenSSL ClientHellos, any chunking, any record split; alerts."""

from __future__ import annotations

import asyncio
import ssl

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.demo.pki import DemoPki
from tests.support.tls import HOST, build_hello, sni_ext, ssl_client_hello_records, tls_records
from wire.client_hello import ClientHelloError, ClientHelloInfo
from wire.tls import MAX_PEEK_BYTES, ClientHelloReader, TlsAlert, TlsPeekError, looks_like_tls, tls_alert

RECORDS = ssl_client_hello_records(alpn=("h2", "grpc-exp"))
EXPECTED = ClientHelloInfo(server_name=HOST, alpn=("h2", "grpc-exp"))


def test_whole() -> None:
    assert ClientHelloReader().feed(RECORDS) == EXPECTED


def test_one_byte_at_a_time() -> None:
    reader = ClientHelloReader()
    results = [reader.feed(RECORDS[i : i + 1]) for i in range(len(RECORDS))]
    assert results[:-1] == [None] * (len(RECORDS) - 1)
    assert results[-1] == EXPECTED


def test_several_records_one_byte_at_a_time() -> None:
    data = tls_records(RECORDS[5:], [1, 3, 40, 100])
    reader = ClientHelloReader()
    results = [reader.feed(data[i : i + 1]) for i in range(len(data))]
    assert results[-1] == EXPECTED
    assert results.count(None) == len(data) - 1


def test_tls12_and_no_sni_hellos() -> None:
    tls12 = ssl_client_hello_records(maximum_version=ssl.TLSVersion.TLSv1_2)
    assert ClientHelloReader().feed(tls12) == ClientHelloInfo(HOST, ("h2",))
    no_sni = ssl_client_hello_records(server_hostname=None, alpn=())
    assert ClientHelloReader().feed(no_sni) == ClientHelloInfo(None, ())


def test_bytes_after_the_hello_are_ignored_and_feed_is_idempotent() -> None:
    reader = ClientHelloReader()
    assert reader.feed(RECORDS + b"\x17\x03\x03\x00\x01x") == EXPECTED
    assert reader.feed(b"anything") == EXPECTED


def test_max_bytes() -> None:
    with pytest.raises(TlsPeekError, match="within 100 bytes"):
        ClientHelloReader(max_bytes=100).feed(RECORDS)
    reader = ClientHelloReader(max_bytes=len(RECORDS))
    assert reader.feed(RECORDS) == EXPECTED


def test_default_budget_refuses_endless_small_records() -> None:
    # Records of 1-byte fragments: 6 bytes per hello byte, the budget runs out first.
    hello = build_hello([sni_ext((0, b"x" * 3000))])
    data = tls_records(hello, [1] * len(hello))
    with pytest.raises(TlsPeekError, match="within"):
        ClientHelloReader().feed(data)
    assert len(data) > MAX_PEEK_BYTES


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x17", "content type 23"),
        (b"\x16\x03\x01\x00\x05\x01\x00\x01\x00\x00" + b"\x15\x03\x03", "content type 21"),
        (b"\x16\x02", "major version 2"),
        (b"\x16\x03\x01\x00\x00", "empty handshake record"),
        (b"\x16\x03\x01" + (2**14 + 257).to_bytes(2, "big"), "exceeds"),
        (b"\x16\x03\x01\x00\x01\x02", "not client_hello"),
        (b"\x16\x03\x01\x00\x04\x01\xff\xff\xff", "exceeds"),
        (tls_records(build_hello([sni_ext((0, b"a")), sni_ext((0, b"b"))]), []), "duplicate"),
    ],
)
def test_refusals(data: bytes, reason: str) -> None:
    with pytest.raises(TlsPeekError, match=reason):
        ClientHelloReader().feed(data)


def test_walker_errors_are_chained() -> None:
    with pytest.raises(TlsPeekError) as info:
        ClientHelloReader().feed(b"\x16\x03\x01\x00\x01\x02")
    assert isinstance(info.value.__cause__, ClientHelloError)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", False),
        (b"\x16", True),
        (b"\x16\x03", True),
        (RECORDS, True),
        (b"\x16\x02", False),
        (b"PRI * HTTP/2.0", False),
        (b"\x17\x03\x03", False),
    ],
)
def test_looks_like_tls(data: bytes, expected: bool) -> None:
    assert looks_like_tls(data) is expected


def test_tls_alert_bytes() -> None:
    assert tls_alert(112) == b"\x15\x03\x03\x00\x02\x02\x70"
    with pytest.raises(ValueError):
        tls_alert(256)


def test_memory_bio_client_reads_the_alert_as_unrecognized_name() -> None:
    ctx = ssl.create_default_context()
    incoming = ssl.MemoryBIO()
    client = ctx.wrap_bio(incoming, ssl.MemoryBIO(), server_hostname=HOST)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    incoming.write(tls_alert(TlsAlert.UNRECOGNIZED_NAME))
    with pytest.raises(ssl.SSLError, match="UNRECOGNIZED_NAME"):
        client.do_handshake()


async def test_loopback_client_gets_unrecognized_name(pki: DemoPki) -> None:
    """A real TLS client over TCP: the peek sees its SNI, the alert fails its handshake."""
    seen: list[ClientHelloInfo] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peek = ClientHelloReader()
        info = None
        while info is None:
            info = peek.feed(await reader.read(4096))
        seen.append(info)
        writer.write(tls_alert(TlsAlert.UNRECOGNIZED_NAME))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    ctx = ssl.create_default_context(cafile=str(pki.ca_path))
    ctx.set_alpn_protocols(["h2"])
    try:
        async with asyncio.timeout(10):
            with pytest.raises(ssl.SSLError, match="UNRECOGNIZED_NAME"):
                await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=HOST)
    finally:
        server.close()
        await server.wait_closed()
    assert seen == [ClientHelloInfo(HOST, ("h2",))]


# --- fuzz ----------------------------------------------------------------------


def _feed_all(chunks: list[bytes], max_bytes: int = MAX_PEEK_BYTES) -> None:
    reader = ClientHelloReader(max_bytes)
    try:
        for chunk in chunks:
            reader.feed(chunk)
    except TlsPeekError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=6))
def test_fuzz_arbitrary_chunks(chunks: list[bytes]) -> None:
    _feed_all(chunks)
    _feed_all([b"\x16\x03\x01", *chunks], max_bytes=400)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 200), max_size=8), st.integers(1, 64))
def test_fuzz_record_split_and_chunking_of_a_real_hello(sizes: list[int], chunk: int) -> None:
    data = tls_records(RECORDS[5:], sizes)
    reader = ClientHelloReader()
    results = [reader.feed(data[i : i + chunk]) for i in range(0, len(data), chunk)]
    assert results[-1] == EXPECTED
    assert all(r is None for r in results[:-1])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(RECORDS) - 1), st.integers(0, 255)), min_size=1, max_size=4))
def test_fuzz_mutated_records(mutations: list[tuple[int, int]]) -> None:
    data = bytearray(RECORDS)
    for pos, value in mutations:
        data[pos] = value
    _feed_all([bytes(data)])


def _outcome(chunks: list[bytes]) -> object:
    """The reader's answer to ``chunks`` (its info, or the error message)."""
    reader = ClientHelloReader()
    try:
        results = [reader.feed(chunk) for chunk in chunks]
    except TlsPeekError as exc:
        return str(exc)
    return results[-1] if results else None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(RECORDS) - 1), st.integers(0, 255)), max_size=3),
       st.integers(0, 40))
def test_fuzz_one_read_and_byte_by_byte_agree(mutations: list[tuple[int, int]], cut: int) -> None:
    """The one-record fast path (the whole hello in the first read) answers like the record loop."""
    data = bytearray(RECORDS)
    for pos, value in mutations:
        data[pos] = value
    whole = bytes(data[: len(data) - cut])
    assert _outcome([whole]) == _outcome([whole[i : i + 1] for i in range(len(whole))])

"""Fuzz targets of the TLS ClientHello: the walker (``wire.client_hello``) and the record-layer
reader of the TCP edge (``wire.tls``), seeded with real ``ssl`` and aioquic hellos."""

from __future__ import annotations

import functools
import random
import ssl

from tests.fuzz.seed_flights import quic_hellos
from tests.fuzz.target import FuzzTarget, check, feed_all, pieces, route_name, tweak
from tests.support.initial_reference import c_handshake_agrees
from tests.support.tls import (
    MAX_IDLE_TIMEOUT_PARAMETER,
    QUIC_TRANSPORT_PARAMETERS_EXTENSION,
    hello_from_parts,
    hello_parts,
    record_payloads,
    ssl_client_hello_records,
    tls_records,
    u16,
    varint,
)
from wire.client_hello import ClientHelloError, parse_client_hello
from wire.tls import ClientHelloReader, TlsPeekError


def run_client_hello(data: bytes) -> str:
    c_handshake_agrees(data)  # the C walk (when built) answers as parse_client_hello
    info = parse_client_hello(data)
    check(info.server_name is None or isinstance(info.server_name, str), "server_name type")
    check(all(isinstance(p, str) and p for p in info.alpn), "alpn entries")
    check(0 <= info.max_idle_timeout_ms < 2**62, "max_idle_timeout is a varint's value")
    if info.server_name is not None:
        route_name(info.server_name)  # what the router does next
    return ("sni" if info.server_name else "no-sni") + ("-idle" if info.max_idle_timeout_ms else "")


def run_tls_peek(data: bytes) -> str:
    """Whole and byte-chunked feeds must agree: the reader promises chunking does not matter."""
    whole = feed_all(ClientHelloReader(), [data], TlsPeekError)
    chunked = feed_all(ClientHelloReader(), pieces(data), TlsPeekError)
    check(whole[0] == chunked[0], f"whole feed {whole[0]} but chunked feed {chunked[0]}")
    if whole[0] == "error":
        raise whole[1]  # type: ignore[misc]
    check(whole[1] == chunked[1], "chunked feed found another ClientHello")
    info = whole[1]
    if info is not None and info.server_name:  # type: ignore[attr-defined]
        route_name(info.server_name)  # type: ignore[attr-defined]
    return "hello" if info is not None else "incomplete"


@functools.cache
def _tls_record_seeds() -> tuple[bytes, ...]:
    return (
        ssl_client_hello_records("stargate-0.stargate.external", ()),
        ssl_client_hello_records("stargate-1.stargate.external", ("h2", "grpc-exp")),
        ssl_client_hello_records(None, ("h2",)),
        ssl_client_hello_records("a" * 63 + ".stargate.external:443", (), ssl.TLSVersion.TLSv1_2),
        ssl_client_hello_records("x.y", ("p" * 255,) * 3),
    )


def client_hello_seeds() -> list[bytes]:
    minimal = b"\x03\x03" + bytes(32) + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    return [r[5:] for r in _tls_record_seeds()] + list(quic_hellos()) + [
        b"\x01" + len(minimal).to_bytes(3, "big") + minimal
    ]


def tls_peek_seeds() -> list[bytes]:
    seeds = list(_tls_record_seeds())
    hello = _tls_record_seeds()[1][5:]
    seeds += [tls_records(hello, (1, 7, 100, 5000)), tls_records(hello, (3,) * 4 + (4096,))]
    seeds.append(seeds[0] + b"\x17\x03\x03\x00\x05hello")  # application data after the hello
    return seeds


TLS_DICTIONARY = (
    b"\x16\x03\x01", b"\x16\x03\x03", b"\x00\x00", b"\x00\x10", b"\x00\x2b", b"\xff\xff", b"\x40\x00",
    b"\x01\x00\x00", b"\x00\x00\x00\x00", b"h2", b"stargate-0.stargate.external",
)


NAMES = (
    b"stargate-0.stargate.external", b"STARGATE-1.Stargate.External.", b"stargate-0.stargate.external:50072",
    b"", b"\x00", b"\xff\xfe\x80", b"a" * 300, b"x.stargate-0.stargate.external", b"10.0.0.1", b"[::1]:443",
    b"stargate-0.stargate.external\x00.evil", "stargate-é.stargate.external".encode(), b".stargate.external",
    b"-.stargate.external", b"stargate-0..stargate.external", b"%s.stargate.external" % (b"b" * 64),
    b"stargate-0.stargate.external:650710", b"stargate-0.stargate.external.:65535",
    b"stargate-0.stargate.external:" + b"0" * 9000, b"stargate-1.stargate.external.:" + b"7" * 300,
)


def mutate_hello(hello: bytes, rng: random.Random) -> bytes | None:
    """Change SNI/ALPN/QUIC transport parameters/extension list/head fields of a ClientHello and fix
    every length."""
    parts = hello_parts(hello)
    if parts is None:
        return None
    head, extensions = parts
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.25 and extensions:
            i = rng.randrange(len(extensions))
            extensions[i] = (extensions[i][0], tweak(extensions[i][1], rng))
        elif roll < 0.45:
            names = b"".join(bytes((rng.choice((0, 0, 0, 1, 255)),)) + u16(len(n)) + n
                             for n in rng.choices(NAMES, k=rng.choice((0, 1, 1, 1, 2, 3))))
            body = u16(len(names) + rng.choice((0, 0, 0, 0, 1, -1))) + names
            _put_extension(extensions, 0, body, rng)
        elif roll < 0.6:
            protocols = b"".join(bytes((len(p),)) + p for p in rng.choices((b"h2", b"", b"grpc", b"x" * 255), k=2))
            _put_extension(extensions, 16, u16(len(protocols) + rng.choice((0, 0, 0, 1))) + protocols, rng)
        elif roll < 0.68:
            _put_extension(extensions, QUIC_TRANSPORT_PARAMETERS_EXTENSION, _transport_parameters(rng), rng)
        elif roll < 0.74 and extensions:
            extensions.insert(rng.randrange(len(extensions) + 1), rng.choice(extensions))
        elif roll < 0.8 and extensions:
            extensions.pop(rng.randrange(len(extensions)))
        elif roll < 0.9:
            rng.shuffle(extensions)
        else:
            head = tweak(head, rng)
    return hello_from_parts(head, extensions)


def _transport_parameters(rng: random.Random) -> bytes:
    """A quic_transport_parameters body: parameters of any id (max_idle_timeout often, sometimes twice),
    values of any length, varints of any width, and now and then a length that lies or a cut."""
    body = b""
    for _ in range(rng.randint(0, 5)):
        parameter = rng.choice((MAX_IDLE_TIMEOUT_PARAMETER, MAX_IDLE_TIMEOUT_PARAMETER, 0x04, 0x0F, 0x2A, 2**62 - 1))
        if parameter == MAX_IDLE_TIMEOUT_PARAMETER and rng.random() < 0.8:
            value = varint(rng.choice((0, 1, 2_000, 30_000, 2**62 - 1)), rng.choice((None, 8)))
            value += b"\x00" if rng.random() < 0.1 else b""  # a value longer than its varint
        else:
            value = rng.randbytes(rng.randint(0, 12))
        length = len(value) + rng.choice((0, 0, 0, 0, 0, 0, 1, -1)) if value else len(value)
        body += varint(parameter, rng.choice((None, 8))) + varint(max(0, length)) + value
    return body[: rng.randint(0, len(body))] if rng.random() < 0.1 else body


def _put_extension(extensions: list[tuple[int, bytes]], ext_type: int, body: bytes, rng: random.Random) -> None:
    at = [i for i, (t, _) in enumerate(extensions) if t == ext_type]
    if at and rng.random() < 0.8:
        extensions[rng.choice(at)] = (ext_type, body)
    else:
        extensions.insert(rng.randrange(len(extensions) + 1), (ext_type, body))


def mutate_hello_input(data: bytes, rng: random.Random) -> bytes | None:
    return mutate_hello(data, rng)


def mutate_records(data: bytes, rng: random.Random) -> bytes | None:
    """Mutate the ClientHello inside the records, then fragment it again at random sizes."""
    hello = mutate_hello(record_payloads(data), rng)
    if hello is None:
        return None
    sizes = [rng.choice((1, 2, 5, 64, 300, 16384)) for _ in range(rng.randint(1, 6))]
    return tls_records(hello, sizes) + (rng.randbytes(rng.randint(1, 20)) if rng.random() < 0.1 else b"")


@functools.cache
def hellos() -> tuple[bytes, ...]:
    """Every ClientHello seed, cached: the QUIC mutators carry them in CRYPTO frames."""
    return tuple(client_hello_seeds())


TLS_TARGETS = (
    FuzzTarget("clienthello", run_client_hello, (ClientHelloError,), client_hello_seeds, 20_000, TLS_DICTIONARY,
               mutate_hello_input, reaches_c=True),
    FuzzTarget("tls_peek", run_tls_peek, (TlsPeekError,), tls_peek_seeds, 20_000, TLS_DICTIONARY, mutate_records,
               reaches_c=True),
)

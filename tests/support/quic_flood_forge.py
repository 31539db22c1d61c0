"""The Initial flood's datagrams: garbage, probes, cut and short Initials, partial hellos and
refusable attempts, forged from a real aioquic ClientHello under real Initial keys; and the
check that every reply seen from outside answers a datagram at least as large."""

from __future__ import annotations

import contextlib
import random
import socket
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from quic.frames import QUIC_MAX_CRYPTO_BYTES
from quic.packet import QUIC_V1, QUIC_V2, QUIC_VERSION_NEGOTIATION, QuicPacketError, parse_long_header
from tests.support.initial_packets import protected_initial
from tests.support.quic_frames import crypto_frame
from tests.support.quic_initial_rewriter import client_first_flight, open_flight

SNI_UNKNOWN = b"aaaaaaaaaaaaaaaa.nowhere.example"
SNI_NO_SUCH_POD = b"stargate-zzzzzzzz.stargate.external"
REFUSED_KINDS = {  # kind -> weight, for the half of the sockets whose attempts get refused
    "garbage": 15, "probe": 5, "short_initial": 12, "cut_initial": 12, "unknown_sni": 30, "retransmit": 14,
    "small_retransmit": 12,
}
PENDING_KINDS = {  # and for the half that keeps flows pending (their other datagrams queue behind)
    "partial_hello": 40, "garbage": 20, "unknown_sni": 20, "cut_initial": 20,
}


@dataclass
class Attempt:
    """A refused-to-be attempt (unknown SNI) and every datagram that may earn its answer."""

    dcid: bytes
    sizes: list[int] = field(default_factory=list)


class FloodForge:
    """Builds flood datagrams from a real aioquic ClientHello, protected with real Initial keys."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.hellos = [first_hello(SNI_UNKNOWN), first_hello(SNI_NO_SUCH_POD)]
        self.last_refusable: dict[socket.socket, bytes] = {}
        self.attempts: dict[bytes, Attempt] = {}
        """Client SCID -> attempt: a CONNECTION_CLOSE answer is addressed to that SCID."""
        self.probes: dict[bytes, list[int]] = defaultdict(list)
        """SCID of a datagram that may earn Version Negotiation -> its sizes (the VN echoes it as DCID)."""

    def datagram(self, sock: socket.socket, kinds: dict[str, int]) -> tuple[str, bytes]:
        kind = self.rng.choices(list(kinds), list(kinds.values()))[0]
        last = self.last_refusable.get(sock)
        if kind in ("retransmit", "small_retransmit") and last is None:
            kind = "unknown_sni"
        if kind == "garbage":
            garbage = self._garbage()
            with contextlib.suppress(QuicPacketError):  # a random long header of an unknown version
                self.probes[parse_long_header(garbage).scid].append(len(garbage))
            return kind, garbage
        if kind == "probe":
            return kind, self._probe()
        if kind == "retransmit":
            assert last is not None
            self.attempts[_scid_of(last)].sizes.append(len(last))
            return kind, last
        if kind == "small_retransmit":  # header-only "Initial" for the refused DCID: 20-200 bytes
            assert last is not None
            header = parse_long_header(last)
            small = self._small_initial(header.version, header.dcid, header.scid, self.rng.randint(0, 150))
            self.attempts[header.scid].sizes.append(len(small))
            return kind, small
        version = self.rng.choice((QUIC_V1, QUIC_V2))
        dcid, scid = self.rng.randbytes(self.rng.choice((8, 8, 12, 20))), self.rng.randbytes(8)
        hello = self._random_sni(self.rng.choice(self.hellos))
        if kind == "unknown_sni":
            datagram = protected_initial(crypto_frame(0, hello), version=version, dcid=dcid, scid=scid,
                                         size=self.rng.randint(1200, 1350))
            self.last_refusable[sock] = datagram
            self.attempts[scid] = Attempt(dcid, [len(datagram)])
            return kind, datagram
        if kind == "short_initial":
            return kind, protected_initial(crypto_frame(0, hello), version=version, dcid=dcid, scid=scid,
                                          size=self.rng.randint(600, 1199))
        if kind == "cut_initial":
            whole = protected_initial(crypto_frame(0, hello), version=version, dcid=dcid, scid=scid, size=1250)
            return kind, whole[: self.rng.randint(7, len(whole) - 1)]
        # partial_hello: the ClientHello's start, or a lone piece far into the CRYPTO stream
        if self.rng.random() < 0.5:
            frames = crypto_frame(0, hello[: self.rng.randint(1, len(hello) - 1)])
        else:
            frames = crypto_frame(self.rng.randint(1000, QUIC_MAX_CRYPTO_BYTES - 1000), hello[:900])
        return kind, protected_initial(frames, version=version, dcid=dcid, scid=scid, size=self.rng.randint(1200, 1350))

    def _garbage(self) -> bytes:
        data = bytearray(self.rng.randbytes(self.rng.randint(1, 1400)))
        if len(data) >= 5 and data[0] & 0x80 and int.from_bytes(data[1:5], "big") in (QUIC_V1, QUIC_V2):
            data[1] ^= 0x55  # never a real version: garbage stays garbage
        return bytes(data)

    def _probe(self) -> bytes:
        scid = self.rng.randbytes(8)
        probe = b"\xc0" + (0x1A2A3A4A).to_bytes(4, "big") + b"\x08" + self.rng.randbytes(8) + b"\x08" + scid
        probe = probe.ljust(self.rng.randint(1200, 1300), b"\x00")
        self.probes[scid].append(len(probe))
        return probe

    def _small_initial(self, version: int, dcid: bytes, scid: bytes, tail: int) -> bytes:
        first = 0xC0 | ((1 if version == QUIC_V2 else 0) << 4)
        head = bytes((first,)) + version.to_bytes(4, "big") + bytes((len(dcid),)) + dcid
        head += bytes((len(scid),)) + scid + b"\x00"  # no token
        return head + bytes((0x40 | tail >> 8, tail & 0xFF)) + self.rng.randbytes(tail)

    def _random_sni(self, hello: bytes) -> bytes:
        for name, run in ((SNI_UNKNOWN, 16), (SNI_NO_SUCH_POD[9:], 8)):
            at = hello.find(name)
            if at >= 0:
                letters = bytes(self.rng.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(run))
                return hello[:at] + letters + hello[at + run :]
        return hello


def first_hello(server_name: bytes) -> bytes:
    """The ClientHello of a real aioquic client naming ``server_name``."""
    _, flight = client_first_flight(server_name=server_name.decode())
    return open_flight(flight).crypto


def _scid_of(datagram: bytes) -> bytes:
    return parse_long_header(datagram).scid


@dataclass
class ReplyCheck:
    """Replies seen from outside, matched to what may have provoked them."""

    vn: int = 0
    closes: int = 0
    most_answers: int = 0
    """Most CONNECTION_CLOSEs one attempt got: QUIC_ANSWERS_PER_REJECTION unless its address
    interleaved another attempt (one remembered attempt per address, by design)."""
    violations: list[str] = field(default_factory=list)


def check_replies(replies: list[bytes], forge: FloodForge) -> ReplyCheck:
    """Each VN echoes one datagram no smaller than it; each CONNECTION_CLOSE answers one attempt, at
    most as often as that attempt sent datagrams at least as large as the answer."""
    result = ReplyCheck()
    per_attempt: Counter[bytes] = Counter()
    sizes: dict[bytes, int] = {}
    for reply in replies:
        try:
            header = parse_long_header(reply)
        except QuicPacketError:
            result.violations.append(f"unparseable {len(reply)}-byte reply")
            continue
        if header.version == QUIC_VERSION_NEGOTIATION:
            result.vn += 1
            sizes_sent = forge.probes.get(header.dcid, [])
            fitting = [s for s in sizes_sent if s >= len(reply)]
            if not fitting:
                result.violations.append(f"VN of {len(reply)} bytes answers no datagram of that size or more")
            else:
                sizes_sent.remove(min(fitting))  # one answer per datagram
            continue
        attempt = forge.attempts.get(header.dcid)
        if header.version not in (QUIC_V1, QUIC_V2) or attempt is None:
            result.violations.append(f"{len(reply)}-byte reply to no attempt of ours")
            continue
        result.closes += 1
        per_attempt[header.dcid] += 1
        sizes[header.dcid] = len(reply)
    for scid, count in per_attempt.items():
        eligible = sum(1 for s in forge.attempts[scid].sizes if s >= sizes[scid])
        if count > eligible:
            result.violations.append(f"{count} answers of {sizes[scid]} bytes, {eligible} datagrams that large")
        result.most_answers = max(result.most_answers, count)
    return result

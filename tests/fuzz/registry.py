"""Every fuzz target by name: every parser that reads untrusted bytes, with real seeds and its one allowed error.

Used by ``tests/fuzz/run_fuzz.py`` (the mutation fuzzer: by hand, and for a bounded number of
inputs in CI, under the sanitizers, by ``tests/sanitize/run``) and
``tests/fuzz/test_fuzz_regressions.py`` (every saved crash input, replayed in CI). A target
turns bytes into calls of one parser; only that parser's own error type may escape. Any
other exception, or a broken invariant (``FuzzInvariantError``), is a crash. Seeds come
from real clients: ``ssl`` ClientHellos, ``h2`` client streams, aioquic first flights
(whole protected datagrams, and their decrypted frames re-encrypted so that mutations reach
the frame parser), and EndpointSlice documents from ``router/demo/``. The targets live in
``targets_tls``, ``targets_h2``, ``targets_quic``, ``targets_endpoints`` and ``targets_proxy``.

====================  ===========================================================  =================
target                what runs (and the invariant checked besides "no other error")  allowed error
====================  ===========================================================  =================
clienthello           ``client_hello_parser`` (its C walk = ``parse_client_hello``),     ClientHelloError
                      then the hostname match
tls_peek              ``ClientHelloReader.feed``, whole and chunked must agree          TlsPeekError
h2_request            ``H2RequestReader.feed``, whole and chunked must agree            H2PeekError
settings_ack          ``SettingsAckStripper.feed``: input minus exactly one ACK out     H2PeekError
initial_frames        ``walk_initial_frames`` into a ``CryptoReassembler``              QuicPacketError
initial_native        ``sniff_first_payload`` (C) declines or equals the Python         (none)
                      reference (``quic.frames`` and ``parse_client_hello``)
long_header_native    the C long-header parse declines or equals ``read_long_header``  (none)
                      at every coalesced packet's offset
sniffer_payloads      ``InitialSniffer.feed`` on re-encrypted mutated frames            QuicPacketError
first_initial_native  the first Initial read in one C call leaves the sniffer as     (none)
                      the Python path does (answers, version, CIDs, packet number)
sniffer_datagrams     ``InitialSniffer.feed`` on mutated protected datagrams            QuicPacketError
udp_router            ``UdpRouter``'s datagram path (no sockets): answers never         (none)
                      larger than their datagram, pending flows within their bound,
                      no kept connection ID over 20 octets, no bug logged
quic_lb_cid           ``routable_cid`` then ``server_id``: a connection ID of 1-20     (none)
                      octets where the datagram holds it, or none
endpoints             ``parse_endpoints_document`` then ``targets_from_slices``         EndpointSliceError
proxy_protocol        ``ProxyHeaderReader.feed``, whole and chunked must agree;        ProxyHeaderError
                      a header within its bound, header + remainder = the input
====================  ===========================================================  =================

The ``*_native`` targets compare the C of ``quic/_initial_protection.c`` with the pure-Python
reference (``tests/support/initial_reference.py``), never with itself; they and every other
target marked ``reaches_c`` run under ASan and UBSan in ``tests/sanitize/run``. Their corpora grow
from structured mutations (``mutators_native``: lying lengths, CIDs of 21-255 bytes, coalesced
packets, shuffled and overlapping CRYPTO pieces, truncations) kept in ``tests/fuzz/corpus/``.

Input conventions: multi-datagram targets split their input on ``SEPARATOR`` (for
``udp_router`` an empty part hands over to the next client address); the QUIC payload
target's first byte picks the version and packet number length.
"""

from __future__ import annotations

from tests.fuzz.target import FuzzTarget
from tests.fuzz.targets_endpoints import ENDPOINTS_TARGETS
from tests.fuzz.targets_h2 import H2_TARGETS
from tests.fuzz.targets_proxy import PROXY_TARGETS
from tests.fuzz.targets_quic import QUIC_TARGETS
from tests.fuzz.targets_tls import TLS_TARGETS

TARGETS: dict[str, FuzzTarget] = {
    t.name: t for t in (*TLS_TARGETS, *H2_TARGETS, *QUIC_TARGETS, *ENDPOINTS_TARGETS, *PROXY_TARGETS)
}
"""Every fuzz target by name (crash files are named ``<target>--<signature>--<sha1>.bin``)."""


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

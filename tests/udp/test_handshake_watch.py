"""When a flow is confirmed (``router.udp.handshake_watch``): on bytes, no sockets."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from router.udp.handshake_watch import HandshakeWatch

POD_CID = bytes(range(1, 9))


def short_header(dcid: bytes, size: int = 60) -> bytes:
    return bytes([0x40]) + dcid + b"\0" * (size - 1 - len(dcid))


def test_a_routed_flow_is_confirmed_by_a_short_header_to_the_pods_connection_id_only() -> None:
    watch = HandshakeWatch(0.0)
    assert not watch.client_sent(bytes([0xC0]) + b"\0" * 1199, [])  # its Initial
    assert not watch.client_sent(short_header(b"\x09" * 8), [POD_CID])  # a DCID the pod never chose
    assert not watch.pod_sent(1200)  # the pod's answer confirms a routed flow on its own never
    assert not watch.client_sent(bytes([0xE0]) + POD_CID, [POD_CID])  # a Handshake packet: still a long header
    assert watch.client_sent(short_header(POD_CID), [b"\x07" * 8, POD_CID])


def test_with_a_zero_length_pod_connection_id_any_short_header_after_the_pods_answer_confirms() -> None:
    watch = HandshakeWatch(0.0)
    assert not watch.client_sent(short_header(b""), [])  # before the pod said anything: a blind guess
    watch.pod_sent(1200)
    assert watch.client_sent(short_header(b""), [])


def test_a_flow_whose_pod_chose_a_connection_id_is_confirmed_by_that_id_only_even_once_it_moved_on() -> None:
    watch = HandshakeWatch(0.0)
    watch.pod_sent(1200)
    watch.pod_chose_cid = True  # the table learned it, then another flow took it: the flow holds none
    assert not watch.client_sent(short_header(b"\x09" * 8), [])


def test_a_joined_flow_is_confirmed_by_the_pods_answer_as_long_as_the_clients_longest() -> None:
    watch = HandshakeWatch(0.0, joined=True)
    assert not watch.client_sent(short_header(POD_CID, 1200), [POD_CID])  # the client's bytes confirm no join
    assert not watch.pod_sent(1199)  # a stateless reset is shorter than what caused it
    assert watch.pod_sent(1200)  # a PATH_CHALLENGE padded to 1200 bytes, or data


def test_a_joined_flow_is_confirmed_by_more_pod_datagrams_than_the_client_sent() -> None:
    watch = HandshakeWatch(0.0, joined=True)
    for _ in range(3):
        watch.client_sent(short_header(POD_CID, 1400), [])
    assert not watch.pod_sent(100, 3)
    assert watch.pod_sent(100)


@given(st.lists(st.integers(22, 1500), min_size=1, max_size=50))
def test_stateless_resets_never_confirm_a_join(sizes: list[int]) -> None:
    """One reset per datagram received, each shorter than it (RFC 9000 section 10.3), whatever the
    client sends and in whatever order."""
    watch = HandshakeWatch(0.0, joined=True)
    for size in sizes:
        assert not watch.client_sent(short_header(b"", size), [])
        assert not watch.pod_sent(size - 1)

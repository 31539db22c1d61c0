"""UdpFlowTable and ByteBudget: the QUIC router's bookkeeping, on plain values (no sockets)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quic.packet import long_header_scid
from router.outcomes import QuicDropReason
from router.udp.flow_limits import FlowLimits, FlowTableError
from router.udp.flow_table import UdpFlowTable
from router.udp.flows import Flow, PendingFlow
from router.udp.refusals import ByteBudget
from router.udp.verdicts import Verdict, classify_unrouted
from tests.support.initial_packets import long_header_packet as _long

A = ("192.0.2.1", 1000)
B = ("192.0.2.2", 2000)
C = ("192.0.2.3", 3000)

Table = UdpFlowTable[str, str]


def _table(**limits: float) -> Table:
    return UdpFlowTable(FlowLimits(**limits))  # type: ignore[arg-type]


def _pending(table: Table, address: tuple[str, int], now: float = 0.0) -> PendingFlow[str]:
    opened = table.open_pending(address, "sniffer", now)
    assert isinstance(opened, PendingFlow)
    return opened


def _flow(table: Table, address: tuple[str, int], now: float = 0.0, confirmed: bool = True) -> Flow[str]:
    """A flow to stargate-0; ``confirmed`` (by default): its client and pod were seen talking."""
    flow = table.establish(_pending(table, address, now), "stargate-0", "link", now)
    if confirmed:
        table.confirm(flow)
    return flow


def test_limits_that_bound_nothing_are_refused_naming_the_field() -> None:
    with pytest.raises(FlowTableError, match="max_pending_flows"):
        FlowLimits(max_pending_flows=0)
    with pytest.raises(FlowTableError, match="idle_timeout_s"):
        FlowLimits(idle_timeout_s=-1.0)


def test_pending_flows_are_bounded_then_the_whole_table() -> None:
    table = _table(max_pending_flows=2, max_flows=3)
    _pending(table, A)
    _pending(table, B)
    assert table.open_pending(C, "s", 0.0) == "pending_full"
    table.establish(table.pending(A, b""), "stargate-0", "link", 0.0)  # type: ignore[arg-type]
    _pending(table, C)
    assert table.open_pending(("192.0.2.4", 1), "s", 0.0) == "flow_table_full"
    assert (table.pending_count, table.flow_count) == (2, 1)


def test_a_full_pending_table_evicts_its_oldest_undecided_flow_to_admit_one_more() -> None:
    table = _table(max_pending_flows=3)
    assert table.make_room(A) is None  # room left: nobody is evicted
    a, b, _ = _pending(table, A, 0.0), _pending(table, B, 1.0), _pending(table, C, 2.0)
    a.decided = True  # its pod's socket is being opened: about to leave on its own
    assert table.make_room(("192.0.2.4", 4)) is b
    assert table.pending(B, b"") is None and table.pending_count == 2
    d = _pending(table, ("192.0.2.4", 4), 3.0)
    assert table.pending_count == 3 and table.pending_flows()[-1] is d
    assert table.expire(3.5).pending == (a,)  # creation order still drives expiry
    _pending(table, A, 4.0)
    for pending in table.pending_flows():
        pending.decided = True
    assert table.pending_count == 3 and table.make_room(("192.0.2.5", 5)) is None  # nobody to evict: refused
    assert table.open_pending(B, "s", 4.0) == "pending_full"


def test_opening_an_address_and_dcid_twice_is_a_programming_error() -> None:
    table = _table(max_pending_flows_per_address=2)
    _pending(table, A)
    with pytest.raises(FlowTableError):
        table.open_pending(A, "s", 0.0)
    assert isinstance(table.open_pending(A, "s", 0.0, dcid=b"another"), PendingFlow)  # another connection


def test_pending_flows_are_bounded_per_address_and_an_address_at_its_bound_evicts_nobody() -> None:
    table = _table(max_pending_flows=3, max_pending_flows_per_address=2)
    a1 = table.open_pending(A, "s", 0.0, dcid=b"1")
    table.open_pending(A, "s", 0.0, dcid=b"2")
    assert table.open_pending(A, "s", 0.0, dcid=b"3") == "pending_full"
    _pending(table, B)
    assert table.make_room(A) is None  # A's own bound refuses it: nobody else pays
    assert table.make_room(C) is a1  # the table's bound: the oldest goes
    assert isinstance(table.open_pending(A, "s", 1.0, dcid=b"3"), PendingFlow)  # A has room again


def test_pending_buffer_is_bounded_by_datagrams_and_bytes() -> None:
    table = _table(max_pending_datagrams_per_flow=3, max_pending_bytes_per_flow=3000)
    pending = _pending(table, A)
    assert table.buffer(pending, b"x" * 1200)
    assert table.buffer(pending, b"y" * 1200)
    assert not table.buffer(pending, b"z" * 1200)  # 3600 bytes > 3000
    assert table.buffer(pending, b"z" * 100)
    assert not table.buffer(pending, b"w")  # fourth datagram
    assert pending.datagrams == [b"x" * 1200, b"y" * 1200, b"z" * 100]
    assert pending.buffered_bytes == 2500


def test_establish_moves_the_address_from_pending_to_flows_keeping_the_datagrams() -> None:
    table = _table()
    pending = _pending(table, A)
    table.buffer(pending, b"first")
    flow = table.establish(pending, "stargate-1", "link", 5.0)
    assert table.pending(A, b"") is None and table.flow(A) is flow
    assert (flow.pod_name, flow.handle, flow.last_active) == ("stargate-1", "link", 5.0)
    assert pending.datagrams == [b"first"]
    with pytest.raises(FlowTableError):
        table.establish(pending, "stargate-1", "link", 5.0)


def test_pending_flows_expire_at_their_deadline_and_not_before() -> None:
    table = _table(pending_flow_timeout_s=3.0)
    a = _pending(table, A, now=0.0)
    _pending(table, B, now=2.0)
    assert table.expire(2.9).pending == ()
    assert table.expire(3.0).pending == (a,)
    assert table.pending(A, b"") is None and table.pending(B, b"") is not None


def test_idle_flows_expire_active_ones_stay() -> None:
    table = _table(idle_timeout_s=10.0)
    idle = _flow(table, A, now=0.0)
    busy = _flow(table, B, now=0.0)
    busy.last_active = 8.0
    expired = table.expire(10.0)
    assert expired.flows == (idle,)
    assert table.flow(A) is None and table.flow(B) is busy
    assert table.expire(17.9).flows == ()
    assert table.expire(18.0).flows == (busy,)


@pytest.mark.parametrize(
    ("client_ms", "expected_s"),
    [(0, 300.0), (2_000, 4.0), (10_000, 11.0), (30_000, 31.0), (299_500, 300.0), (10**15, 300.0)],
    ids=["none", "under_three_ptos", "ten_s", "thirty_s", "near_the_bound", "huge"],
)
def test_a_flows_idle_timeout_is_its_clients_at_least_three_ptos_never_past_the_relay_bound(
    client_ms: int, expected_s: float
) -> None:
    limits = FlowLimits(idle_timeout_s=300.0, probe_timeout_s=1.0, idle_grace_s=1.0)
    assert limits.flow_idle_timeout_s(client_ms) == pytest.approx(expected_s)
    assert limits.shortest_flow_idle_s == pytest.approx(4.0)


def test_each_flow_expires_after_its_own_idle_timeout() -> None:
    table = _table(idle_timeout_s=300.0)
    quick = table.establish(_pending(table, A), "stargate-0", "link", 0.0, idle_timeout_s=4.0)
    table.confirm(quick)
    slow = _flow(table, B, now=0.0)
    assert (quick.idle_timeout_s, slow.idle_timeout_s) == (4.0, 300.0)
    assert table.expire(3.9).flows == ()
    assert table.expire(4.0).flows == (quick,)
    assert table.expire(299.9).flows == () and table.expire(300.0).flows == (slow,)


def test_an_unconfirmed_flow_lives_the_handshake_timeout_whatever_its_idle_timeout() -> None:
    table = _table(idle_timeout_s=300.0, handshake_timeout_s=10.0)
    silent = _flow(table, A, now=0.0, confirmed=False)
    chatty = _flow(table, B, now=1.0, confirmed=False)
    talking = _flow(table, C, now=0.0, confirmed=False)
    table.confirm(talking)
    chatty.last_active = 10.5  # a flood's datagrams keep no unconfirmed flow alive
    assert not silent.confirmed and talking.confirmed and table.unconfirmed_count == 2
    assert table.expire(9.9).unconfirmed == ()
    assert table.expire(10.0).unconfirmed == (silent,)
    assert table.expire(11.0).unconfirmed == (chatty,)
    assert table.flows() == (talking,) and table.unconfirmed_count == 0
    assert table.expire(299.9).flows == () and table.expire(300.0).flows == (talking,)


def test_a_full_table_evicts_its_oldest_unconfirmed_flow_never_a_confirmed_one() -> None:
    table = _table(max_flows=3)
    assert table.evict_unconfirmed() is None  # room left: nobody is evicted
    confirmed = _flow(table, A, now=0.0)
    older = _flow(table, B, now=1.0, confirmed=False)
    newer = _flow(table, C, now=2.0, confirmed=False)
    assert table.full and table.evict_unconfirmed() is older
    assert table.flows() == (confirmed, newer) and not table.full
    _flow(table, B, now=3.0)
    assert table.evict_unconfirmed() is newer
    _flow(table, C, now=4.0)
    assert table.full and table.evict_unconfirmed() is None  # all confirmed: a newcomer is refused
    assert table.open_pending(("192.0.2.4", 4), "s", 5.0) == "flow_table_full"


def test_learned_cids_find_the_flow_and_are_bounded_oldest_first() -> None:
    table = _table(max_learned_cids_per_flow=2)
    flow = _flow(table, A)
    for cid in (b"\x01" * 8, b"\x02" * 8, b"\x03" * 8):
        table.learn_cid(flow, cid)
    assert table.flow_for_cid(b"\x01" * 8) is None
    assert table.flow_for_cid(b"\x02" * 8) is flow and table.flow_for_cid(b"\x03" * 8) is flow
    assert table.cid_lengths == (8,)
    table.learn_cid(flow, b"\x03" * 8)  # already known: no churn
    assert list(flow.cids) == [b"\x02" * 8, b"\x03" * 8]
    table.learn_cid(flow, b"")  # zero-length CIDs identify nothing
    assert list(flow.cids) == [b"\x02" * 8, b"\x03" * 8]


def test_a_cid_belongs_to_its_latest_flow_and_removal_forgets_it() -> None:
    table = _table()
    a, b = _flow(table, A), _flow(table, B)
    table.learn_cid(a, b"cid-5")
    table.learn_cid(b, b"cid-5")
    assert table.flow_for_cid(b"cid-5") is b and list(a.cids) == []
    assert table.remove(b)
    assert table.flow_for_cid(b"cid-5") is None and table.cid_lengths == ()
    assert not table.remove(b)


def test_migration_rekeys_the_flow_to_the_new_address() -> None:
    table = _table()
    flow = _flow(table, A)
    table.learn_cid(flow, b"12345678")
    assert table.migrate(flow, C)
    assert table.flow(A) is None and table.flow(C) is flow and flow.address == C
    assert table.flow_for_cid(b"12345678") is flow and not flow.shared
    other = _flow(table, B)
    assert table.migrate(flow, B)  # beside the flow there: one endpoint's connections move together
    assert list(table.flows_at(B)) == [other, flow] and flow.shared and other.shared
    assert table.flow(C) is None
    assert table.remove(other) and not table.remove(other)
    assert list(table.flows_at(B)) == [flow]


def test_a_rejection_is_remembered_per_attempt_then_forgotten() -> None:
    table = _table(rejection_memory_s=10.0, answers_per_rejection=3)
    table.rejections.remember((A, b"dcid-1"), b"close", now=0.0)
    rejection = table.rejections.get((A, b"dcid-1"), now=1.0)
    assert rejection is not None and (rejection.answer, rejection.answers_left) == (b"close", 2)
    assert table.rejections.get((B, b"dcid-1"), now=1.0) is None
    assert table.rejections.get((A, b"dcid-2"), now=1.0) is None  # a new attempt is judged afresh
    assert table.rejections.get((A, b"dcid-1"), now=1.0) is rejection  # each attempt of an address on its own
    table.rejections.remember((A, b"dcid-3"), b"close", now=0.0)
    assert table.rejections.get((A, b"dcid-3"), now=10.0) is None


def test_remembered_rejections_are_bounded_and_swept() -> None:
    table = _table(max_remembered_rejections=2, rejection_memory_s=5.0)
    table.rejections.remember((A, b"a"), b"x", now=0.0)
    table.rejections.remember((B, b"b"), b"x", now=1.0)
    table.rejections.remember((C, b"c"), b"x", now=2.0)
    assert len(table.rejections) == 2 and table.rejections.get((A, b"a"), now=2.0) is None
    table.expire(6.0)
    assert len(table.rejections) == 1 and table.rejections.get((C, b"c"), now=6.0) is not None


def test_the_table_says_when_time_has_something_to_expire() -> None:
    table = _table(rejection_memory_s=5.0, idle_timeout_s=10.0)
    woken: list[str] = []
    table.on_occupied = lambda: woken.append("occupied")
    assert table.idle
    flow = _flow(table, A)
    assert not table.idle and woken == ["occupied"]
    table.rejections.remember((B, b"b"), b"x", now=0.0)
    assert woken == ["occupied"] * 2
    table.remove(flow)
    assert not table.idle  # the rejection still expires in time
    table.expire(6.0)
    assert table.idle


def test_byte_budget_spends_refills_and_caps_at_its_burst() -> None:
    budget = ByteBudget(rate_per_s=1000.0, burst=1000.0)
    assert budget.take(600, now=0.0)
    assert not budget.take(600, now=0.0)
    assert budget.take(600, now=0.2)  # 400 + 200 refilled
    assert budget.take(1000, now=100.0)
    assert not budget.take(1, now=100.0)
    assert not budget.take(1, now=50.0)  # a clock going backwards refills nothing
    with pytest.raises(FlowTableError):
        ByteBudget(rate_per_s=0.0, burst=1.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2.0), st.integers(1, 1500)), max_size=60))
def test_byte_budget_never_grants_more_than_burst_plus_rate_times_elapsed(
    steps: list[tuple[float, int]],
) -> None:
    budget = ByteBudget(rate_per_s=5000.0, burst=3000.0)
    now, granted = 0.0, 0
    for delta, size in steps:
        now += delta
        if budget.take(size, now):
            granted += size
    assert granted <= 3000.0 + 5000.0 * now + 1e-6


_ADDRESSES = [("198.51.100.1", port) for port in range(6)]
_CIDS = [bytes([i]) * length for i in range(6) for length in (4, 8)]
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["open", "buffer", "establish", "confirm", "learn", "migrate", "remove", "expire"]),
        st.integers(0, len(_ADDRESSES) - 1),
        st.integers(0, len(_CIDS) - 1),
        st.floats(0, 4.0),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(_OPS)
def test_any_sequence_keeps_bounds_and_the_cid_index_consistent(
    ops: list[tuple[str, int, int, float]],
) -> None:
    limits = FlowLimits(
        max_pending_flows=3, max_pending_flows_per_address=2, max_flows=4, max_learned_cids_per_flow=3,
        max_pending_datagrams_per_flow=2, max_pending_bytes_per_flow=3000, pending_flow_timeout_s=3.0,
        idle_timeout_s=5.0,
    )
    table: Table = UdpFlowTable(limits)
    now = 0.0
    for op, a, k, dt in ops:
        now += dt
        address, cid = _ADDRESSES[a], _CIDS[k]
        pendings = [p for p in table.pending_flows() if p.address == address]
        pending, flow = (pendings[k % len(pendings)] if pendings else None), table.flow(address)
        flows = list(table.flows_at(address))
        if op == "open" and table.pending(address, cid) is None:
            table.make_room(address)
            table.open_pending(address, "s", now, dcid=cid)
        elif op == "buffer" and pending is not None:
            table.buffer(pending, b"x" * 1200)
        elif op == "establish" and pending is not None:
            table.evict_unconfirmed()
            table.establish(pending, "stargate-0", "link", now, idle_timeout_s=dt + 1.0, joined=k % 2 == 0)
        elif op == "confirm" and flows:
            table.confirm(flows[k % len(flows)])
        elif op == "learn" and flows:
            table.learn_cid(flows[k % len(flows)], cid)
        elif op == "migrate" and flows:
            table.migrate(flows[k % len(flows)], _ADDRESSES[k % len(_ADDRESSES)])
        elif op == "remove" and flow is not None:
            table.remove(flow)
        elif op == "expire":
            table.expire(now)
        _check_invariants(table, limits)


def _check_invariants(table: Table, limits: FlowLimits) -> None:
    assert table.pending_count <= limits.max_pending_flows
    per_address: dict[object, int] = {}
    for pending in table.pending_flows():
        per_address[pending.address] = per_address.get(pending.address, 0) + 1
    assert max(per_address.values(), default=0) <= limits.max_pending_flows_per_address
    assert per_address == table._pending_at
    assert table.pending_count + table.flow_count <= limits.max_flows
    flows = table.flows()
    assert len(flows) == len(set(flows)) == table.flow_count
    for address in {f.address for f in flows}:
        here = list(table.flows_at(address))
        assert here[0] is table.flow(address) and all(f.address == address for f in here)
        assert len(here) == 1 or all(f.shared for f in here)  # flows that met tell each other apart by CID
    assert sorted(map(id, flows)) == sorted(id(f) for a in {f.address for f in flows} for f in table.flows_at(a))
    assert all(len(f.client_dcids) <= limits.max_learned_cids_per_flow for f in flows)
    lengths: dict[int, int] = {}
    for flow in flows:
        assert len(flow.cids) <= limits.max_learned_cids_per_flow
        assert len(set(flow.cids)) == len(flow.cids)
        for cid in flow.cids:
            assert table.flow_for_cid(cid) is flow
            lengths[len(cid)] = lengths.get(len(cid), 0) + 1
    assert sorted(table.cid_lengths) == sorted(lengths)
    unconfirmed = [f for f in flows if not f.confirmed]
    assert table.unconfirmed_count == len(unconfirmed)
    oldest_first = [f.handshake.opened_at for f in table._unconfirmed if f.handshake is not None]
    assert set(table._unconfirmed) == set(unconfirmed) and oldest_first == sorted(oldest_first)
    for pending in table.pending_flows():
        assert len(pending.datagrams) <= limits.max_pending_datagrams_per_flow
        assert pending.buffered_bytes <= limits.max_pending_bytes_per_flow
    for cid in _CIDS:
        owner = table.flow_for_cid(cid)
        assert owner is None or owner in flows


# -- classify_unrouted / learning pod CIDs: the policy for datagrams without a flow ------------
POD_CID = bytes(range(1, 9))


def learn_from_pod(table: Table, flow: Flow[str], datagram: bytes, cid_length: int | None) -> None:
    """What the edge does with a pod's datagram: learn the SCID of its v1/v2 long header, if any."""
    scid = long_header_scid(datagram)
    if scid is not None:
        table.learn_pod_cid(flow, scid, cid_length)


def _with_pod_cid(table: Table) -> Flow[str]:
    flow = _flow(table, A)
    learn_from_pod(table, flow, _long(2, 200, dcid=b"c" * 8, scid=POD_CID), cid_length=None)
    return flow


def test_pod_long_headers_teach_their_scid_but_version_negotiation_does_not() -> None:
    table = _table()
    flow = _with_pod_cid(table)
    assert table.flow_for_cid(POD_CID) is flow
    learn_from_pod(table, flow, _long(2, 200, version=0, scid=b"v" * 8), cid_length=None)
    learn_from_pod(table, flow, _long(2, 200, scid=b"x" * 4), cid_length=8)  # not the configured length
    learn_from_pod(table, flow, b"\xc0\x00", cid_length=None)  # garbage teaches nothing
    assert list(flow.cids) == [POD_CID]


def test_a_learned_cid_from_a_new_address_joins_its_flow() -> None:
    table = _table()
    flow = _with_pod_cid(table)
    short = b"\x41" + POD_CID + bytes(30)
    for cid_length in (None, 8):
        got = classify_unrouted(table, short, B, 0.0, cid_length)
        assert (got.verdict, got.flow) == (Verdict.JOIN, flow)
    assert classify_unrouted(table, short, B, 0.0, 4).verdict is Verdict.MISS  # a join may still name its pod
    handshake = _long(2, 300, dcid=POD_CID)
    assert classify_unrouted(table, handshake, B, 0.0, None).flow is flow


@pytest.mark.parametrize(
    ("datagram", "reason"),
    [
        (b"", "malformed"),
        (b"\x40" + bytes(40), "not_initial"),
        (b"\xc0\x00\x00", "malformed"),
        (_long(2, 1300), "not_initial"),  # Handshake from nowhere
        (_long(1, 1300), "not_initial"),  # 0-RTT from nowhere
        (_long(0, 1199), "short_initial"),
        (_long(0, 1300, version=0x1A2A3A4A)[:1199], "not_initial"),  # too small to negotiate
        (_long(0, 1300, version=0), "not_initial"),  # never answer a VN
    ],
    ids=["empty", "short_header", "truncated", "handshake", "zero_rtt", "small_initial", "small_unknown",
         "vn"],
)
def test_unusable_datagrams_are_dropped_with_their_reason(datagram: bytes, reason: str) -> None:
    """Dropped, or (``not_initial``) a miss: dropped with that reason unless a join names its pod."""
    got = classify_unrouted(_table(), datagram, A, 0.0, None)
    verdict = Verdict.MISS if reason == "not_initial" else Verdict.DROP
    assert (got.verdict, got.drop_reason) == (verdict, reason)


def test_initials_open_unknown_versions_negotiate_refused_ones_reanswer() -> None:
    table = _table()
    initial = _long(0, 1200)
    got = classify_unrouted(table, initial, A, 0.0, None)
    assert got.verdict is Verdict.OPEN and got.header is not None and got.header.dcid == b"D" * 8
    unknown_version = _long(0, 1200, version=0x1A2A3A4A)
    assert classify_unrouted(table, unknown_version, A, 0.0, None).verdict is Verdict.NEGOTIATE
    table.rejections.remember((A, b"D" * 8), b"close", now=0.0)
    got = classify_unrouted(table, initial, A, 1.0, None)
    assert got.verdict is Verdict.REANSWER and got.rejection is not None
    assert classify_unrouted(table, _long(0, 1200, dcid=b"N" * 8), A, 1.0, None).verdict is Verdict.OPEN


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=1400), st.sampled_from([None, 4, 8, 20]))
def test_any_bytes_get_a_verdict_never_an_exception(datagram: bytes, cid_length: int | None) -> None:
    table = _table()
    _with_pod_cid(table)
    got = classify_unrouted(table, datagram, B, 0.0, cid_length)
    assert got.verdict is not Verdict.DROP or got.drop_reason in tuple(QuicDropReason)
    learn_from_pod(table, table.flow(A), datagram, cid_length)  # type: ignore[arg-type]

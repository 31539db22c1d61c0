"""The per-client table the workers share: ``python -m bench.client_table``.

Prints two things about ``router.shared_client_limits`` (``--workers N`` with a per-client
limit): what one admission and its release cost in one process, against the process's own dict
(what ``--workers 1`` counts in), and how often a new client finds its probe window full (then it
is counted per worker) at a given fill of the table, for clients at random IPv4 addresses.

    python -m bench.client_table
    python -m bench.client_table --pairs 200000 --trials 5
"""

from __future__ import annotations

import argparse
import os
import socket
import time

from router import constants as c
from router.client_count_table import Admission, ClientCountTable, TableLayout, pack_key
from router.client_limits import ClientCounts, ClientLimitTable
from router.shared_client_limits import CountedRegion, SharedTableFile, create_table_file

FILLS = (0.5, 0.67, 0.8, 0.9)
"""Shares of ``CLIENT_TABLE_CAPACITY`` held by other clients when a new one arrives."""


def pair_cost_us(counts: ClientCounts, pairs: int) -> float:
    """Microseconds per ``try_acquire`` + ``release`` of clients held one at a time."""
    keys = [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(min(pairs, 1 << 20))]
    start = time.perf_counter()
    for i in range(pairs):
        key = keys[i % len(keys)]
        counts.try_acquire(key)
        counts.release(key)
    return (time.perf_counter() - start) / pairs * 1e6


def full_share(fill: float, trials: int, arrivals: int = 20_000) -> tuple[int, int]:
    """``(new clients whose window was full, new clients)`` at ``fill``, over ``trials`` tables."""
    capacity = c.CLIENT_TABLE_CAPACITY
    full = 0
    for _ in range(trials):
        layout = TableLayout(capacity, 2, c.CLIENT_TABLE_PROBE_WINDOW, os.urandom(16))
        table = ClientCountTable(memoryview(bytearray(layout.region_bytes)), layout)
        held = 0
        while held < int(capacity * fill):
            held += table.acquire(pack_key(socket.inet_ntoa(os.urandom(4))), 0, 1) is Admission.ADMITTED
        for _ in range(arrivals):
            key = pack_key(socket.inet_ntoa(os.urandom(4)))
            admission = table.acquire(key, 1, 1)
            full += admission is Admission.FULL
            if admission is Admission.ADMITTED:
                table.release(key, 1)
    return full, trials * arrivals


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=100_000, help="acquire + release pairs timed per table")
    p.add_argument("--trials", type=int, default=3, help="tables filled per fill level")
    args = p.parse_args()
    fd = create_table_file(2)
    shared = SharedTableFile(fd, 0).counts(CountedRegion.TCP_CONNECTIONS, 3)
    print(f"acquire + release, own dict (--workers 1):     {pair_cost_us(ClientLimitTable(3), args.pairs):6.2f} us")
    print(f"acquire + release, shared table (--workers N): {pair_cost_us(shared, args.pairs):6.2f} us")
    for fill in FILLS:
        full, tried = full_share(fill, args.trials)
        print(f"table {fill:.0%} full: {full} of {tried} new clients found their window full ({full / tried:.3%})")


if __name__ == "__main__":
    main()

"""Fuzzing the router's parsers of untrusted bytes.

``registry`` (every target by name, and ``replay``) over ``target`` (what a target is) and one
module per parser family: ``targets_tls``, ``targets_h2``, ``targets_quic``,
``targets_endpoints``; ``seed_flights`` holds the aioquic first flights several of them seed
from. ``run_fuzz`` is the mutation fuzzer (run by hand); ``test_fuzz_regressions`` replays
every saved crash in CI.
"""

"""Smoke test of the benchmark suite: ``python -m bench --quick --only tcp_bulk --rounds 1``.

One cheap scenario end to end (the real router process, HAProxy when installed, helper
processes, a direct baseline) and the JSON it writes. Figures are not judged here: CI
machines vary; bench/README.md holds the measured table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REQUIRED_KEYS = {"name", "metric", "unit", "router", "direct", "ratio_vs_peer", "ratio_vs_direct", "peer"}


def test_quick_tcp_bulk_writes_json_with_router_and_direct_figures(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "tcp_bulk", "--rounds", "1", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["machine"]["nproc"] >= 1
    rows = {row["name"]: row for row in doc["scenarios"]}
    assert {"tcp_bulk_1conn", "tcp_bulk_8conn", "tcp_bulk_1conn_cpu", "tcp_bulk_8conn_cpu"} <= set(rows)
    for row in rows.values():
        assert set(row) >= REQUIRED_KEYS, row
        assert row["router"] is not None and row["router"] > 0, row
        if row["peer"] is not None:
            assert row["peer"] == "haproxy"
            assert row["haproxy"] > 0
            assert abs(row["ratio_vs_peer"] - row["router"] / row["haproxy"]) < 1e-3
    for name in ("tcp_bulk_1conn", "tcp_bulk_8conn"):
        assert rows[name]["unit"] == "MB/s"
        assert rows[name]["direct"] > 0
        assert rows[name]["ratio_vs_direct"] is not None
    assert "tcp_bulk_1conn" in proc.stdout  # the table is printed


def test_unknown_scenario_is_a_usage_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "--only", "nope"], cwd=REPO,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "unknown scenario" in proc.stderr

"""Smoke test of ``python -m bench.flow_table_flood``: one short round at one rate, end to end (the
router process with a 256-flow table, the pods and clients in helper processes) and the JSON it
writes. Rates and shares are not judged here (bench/README.md holds the measured table), but what
the router did with the flood is: after the fix a full table of unconfirmed flows makes room, so
the flood's flows are evicted and nothing is refused ``flow_table_full``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_one_round_at_one_rate_writes_the_row_and_the_router_evicts_instead_of_refusing(tmp_path: Path) -> None:
    out = tmp_path / "flood.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.flow_table_flood", "--rates", "200", "--seconds", "2", "--rounds", "1",
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = json.loads(out.read_text())["rows"]
    assert (row["tree"], row["rate"], row["rounds"]) == ("this", 200.0, 1)
    assert row["legit_total"] > 0 and 0.0 <= row["success"] <= 1.0
    assert row["flow_table_full"] == 0 and row["evicted"] > 0  # the opening burst filled the table
    assert "| this | 200 |" in proc.stdout and "denied (< 99 % of the clients get through)" in proc.stdout


def test_a_bad_rate_or_baseline_is_a_usage_error(tmp_path: Path) -> None:
    for args in (["--rates", "-5"], ["--baseline", str(tmp_path)]):
        proc = subprocess.run([sys.executable, "-m", "bench.flow_table_flood", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2, args
        assert "--rates" in proc.stderr or "--baseline" in proc.stderr

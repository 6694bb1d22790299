"""scripts/bench_under_load.py --quick: it runs the supernet step quiet and beside a busy and a niced loop, through
the nas entry point and without it, and writes its JSON (the speed itself is the benchmark's to judge, not this)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_writes_every_setting_and_neighbour_and_stops_its_neighbours(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NAS_NATIVE_KERNELS": "0"}  # no kernel build in six fresh processes
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_under_load.py"), "--quick", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "under_load.json").read_text())
    assert set(doc["results"]) == {"before", "after"} and doc["plan"]["rounds"] == 1
    for setting, by_kind in doc["results"].items():
        assert set(by_kind) == {"none", "busy", "niced"}
        for kind, r in by_kind.items():
            assert r["tokens_per_s"] > 0 and len(r["runs"]) == 1 and r["runs"][0]["steps_timed"] == 2
            assert isinstance(r["threads"][0], int) and r["threads"][0] >= 1  # the run recorded what it ran on
    assert doc["settings"] == {"before": {"passive": False, "threads": "cores"}, "after": {"passive": True, "threads": None}}
    assert set(doc["targets"]) == {"busy", "niced"} and "wrote" in done.stdout
    pids = [r["runs"][0]["neighbour_pid"] for by_kind in doc["results"].values() for kind, r in by_kind.items()
            if kind != "none"]
    assert len(pids) == 4 and all(pids)
    assert [pid for pid in pids if _cmdline(Path(f"/proc/{pid}"))[-1:] == ["while True: pass"]] == []  # all stopped


def _cmdline(proc: Path) -> list[str]:
    try:
        return (proc / "cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []

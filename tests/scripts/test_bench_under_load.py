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
    assert doc["settings"] == {"before": {"passive": False, "threads": "cores", "environment": {}},
                               "after": {"passive": True, "threads": None, "environment": {}}}
    assert set(doc["targets"]) == {"busy", "niced"} and "wrote" in done.stdout
    pids = [r["runs"][0]["neighbour_pid"] for by_kind in doc["results"].values() for kind, r in by_kind.items()
            if kind != "none"]
    assert len(pids) == 4 and all(pids)
    assert [pid for pid in pids if _cmdline(Path(f"/proc/{pid}"))[-1:] == ["while True: pass"]] == []  # all stopped
    # a short libgomp spin, beside a neighbour that arrives once the run has logged its first step
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_under_load.py"), "--quick", "--out",
                           str(tmp_path / "late"), "--settings", "spin3k", "--neighbours", "none,late"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads((tmp_path / "late" / "under_load.json").read_text())
    assert doc["settings"] == {"spin3k": {"passive": False, "threads": "cores", "environment": {"GOMP_SPINCOUNT": "3000"}}}
    late = doc["results"]["spin3k"]["late"]["runs"][0]
    assert late["steps_timed"] == 2 and late["neighbour_pid"]
    assert _cmdline(Path(f"/proc/{late['neighbour_pid']}"))[-1:] != ["while True: pass"]  # stopped
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_under_load.py"), "--quick", "--out",
                          str(tmp_path / "bad"), "--neighbours", "later"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.strip() == ("bench_under_load: --neighbours: 'later' is not one of none, busy, "
                                                          "niced, late")


def _cmdline(proc: Path) -> list[str]:
    try:
        return (proc / "cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []

"""Threads from the CPU share actually free (``--threads auto``, the training commands' default) and the passive
OpenMP wait policy the ``nas`` entry point sets before torch starts (issue 56: training beside a busy process)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch

from nas.commands.common import resolve_threads_flag, set_threads, threads_value
from nas.entry import prepare_environment
from supernet import threads as T
from supernet.train import resolve_threads

from tests.conftest import ROOT


def stat(ticks: dict[int, tuple[int, ...]]) -> str:
    """A /proc/stat with per-CPU lines (user nice system idle iowait irq softirq steal)."""
    total = [sum(t[i] for t in ticks.values()) for i in range(8)]
    lines = ["cpu  " + " ".join(map(str, total))] + [f"cpu{c} " + " ".join(map(str, t)) + " 0 0" for c, t in ticks.items()]
    return "\n".join(lines + ["intr 1 2 3", "ctxt 99"]) + "\n"


def test_busy_cpus_reads_two_samples_and_counts_niced_work_but_not_idle_or_iowait():
    first = stat({0: (100, 0, 0, 900, 0, 0, 0, 0), 1: (0, 0, 0, 1000, 0, 0, 0, 0), 2: (0, 0, 0, 0, 0, 0, 0, 0)})
    # over the interval: cpu0 fully busy (user), cpu1 half niced work and half iowait, cpu2 not ours
    second = stat({0: (200, 0, 0, 900, 0, 0, 0, 0), 1: (0, 50, 0, 1000, 50, 0, 0, 0), 2: (100, 0, 0, 0, 0, 0, 0, 0)})
    readings = iter([first, second])
    slept = []
    busy = T.busy_cpus({0, 1}, wait=0.25, read=lambda: next(readings), sleep=slept.append)
    assert busy == pytest.approx(1.5) and slept == [0.25]
    assert T.busy_cpus({0}, read=lambda: (_ for _ in ()).throw(OSError("no /proc")), sleep=lambda s: None) is None


def test_choose_threads_leaves_out_cpus_other_work_holds_and_keeps_within_the_quota():
    assert T.choose_threads(2, None, 0.05) == 2  # quiet: both
    assert T.choose_threads(2, None, 1.0) == 1  # a busy loop on one core
    assert T.choose_threads(2, None, 0.6) == 2  # a core 60% busy still counts (TAKEN 0.7)
    assert T.choose_threads(2, None, 0.75) == 1
    assert T.choose_threads(2, None, 2.0) == 1  # all taken: at least one
    assert T.choose_threads(8, None, 3.0) == 5
    assert T.choose_threads(8, 1.5, 0.0) == 1 and T.choose_threads(8, 4.0, 1.0) == 4 and T.choose_threads(8, 0.5, 0) == 1


def test_the_cgroup_quota_is_the_tightest_on_the_path_v2_and_v1(tmp_path):
    assert T.parse_cpu_max("max 100000\n") is None and T.parse_cpu_max("150000 100000") == 1.5
    assert T.parse_cpu_max("garbage") is None
    root = tmp_path / "cgroup"
    (root / "a" / "b").mkdir(parents=True)
    (root / "cpu.max").write_text("max 100000\n")
    (root / "a" / "cpu.max").write_text("200000 100000\n")
    (root / "a" / "b" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "self").write_text("0::/a/b\n")
    assert T.cpu_quota(tmp_path / "self", root) == 2.0  # the parent's quota binds the child
    (tmp_path / "self").write_text("0::/\n")
    assert T.cpu_quota(tmp_path / "self", root) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "job").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "job" / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu,cpuacct" / "job" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "self1").write_text("4:memory:/x\n2:cpu,cpuacct:/job\n")
    assert T.cpu_quota(tmp_path / "self1", v1) == 0.5
    assert T.cpu_quota(tmp_path / "missing", root) is None


def test_auto_resolves_to_the_free_cpus_for_a_new_run_and_a_resumed_run_keeps_its_own(monkeypatch):
    monkeypatch.setattr(T, "auto_threads", lambda: T.Share(2, None, 1.0, "/proc/stat", 1))
    assert resolve_threads("auto") == 1 and resolve_threads(None) == 1  # auto, and a new run's default
    assert resolve_threads(None, resuming=True) is None  # the run's own, from its checkpoint
    assert resolve_threads("auto", resuming=True) == 1 and resolve_threads(3, resuming=True) == 3
    assert threads_value("auto") == "auto" and threads_value("AUTO") == "auto" and threads_value("2") == 2
    for bad in ("0", "two"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected a positive whole number or auto"):
            threads_value(bad)
    args = argparse.Namespace(threads=None, resume=False)
    before = torch.get_num_threads()
    try:
        set_threads(args)
        assert args.threads == 1 and torch.get_num_threads() == 1  # recorded as a number: the run's settings keep it
    finally:
        torch.set_num_threads(before)
    resumed = argparse.Namespace(threads=None, resume=True)
    resolve_threads_flag(resumed)
    assert resumed.threads is None
    assert "1 thread (auto: 2 CPUs, 1.0 busy with other work by /proc/stat)" == T.Share(2, None, 1.0, "/proc/stat", 1).describe()


def test_the_cli_refuses_a_bad_threads_value_naming_the_flag(tmp_path, capsys):
    from nas.cli import main

    with pytest.raises(SystemExit) as stop:  # argparse's refusal of a value: its usage, then the one line
        main(["train-supernet", "tiny", "--out", str(tmp_path / "run"), "--threads", "many"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "nas train-supernet: error: argument --threads: 'many': expected a positive whole number or auto")
    assert not (tmp_path / "run").exists()


def test_the_entry_point_sets_passive_waiting_before_torch_and_keeps_the_users_choice():
    env = {"PATH": "/bin"}
    prepare_environment(env)
    assert env == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    mine = {"OMP_WAIT_POLICY": "ACTIVE"}
    prepare_environment(mine)
    assert mine == {"OMP_WAIT_POLICY": "ACTIVE"}
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | {"PYTHONPATH": str(ROOT)}
    probe = ("import sys, os; import nas.entry as e; before = 'torch' in sys.modules; e.prepare_environment(); "
             "print(before, 'torch' in sys.modules, os.environ['OMP_WAIT_POLICY'])")
    out = subprocess.run([sys.executable, "-c", probe], env=clean, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "PASSIVE"]  # set before anything imported torch
    doctor = subprocess.run([sys.executable, "-m", "nas", "doctor", "--no-build", "--json"], env=clean, cwd=ROOT,
                            capture_output=True, text=True, check=True)
    doc = json.loads(doctor.stdout)
    assert doc["omp_wait_policy"] == "PASSIVE"  # python -m nas went through the entry point
    share = doc["auto_threads"]
    assert 1 <= share["threads"] <= share["cpus"] and share["source"] in ("/proc/stat", "load average", "none")
    assert "OMP_WAIT_POLICY=PASSIVE" in doctor.stderr and "training's --threads auto: " in doctor.stderr
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["nas"] == "nas.entry:main"  # the installed `nas` too

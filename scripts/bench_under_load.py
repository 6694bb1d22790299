"""Training beside other work (issue 56): the supernet step's tokens/s on a quiet machine, beside a busy loop that
holds one core, and beside the same loop at nice 10, for the old defaults and the new ones.

    python scripts/bench_under_load.py --out runs/bench-under-load                 # a quiet machine: ~15 min on 2 cores
    python scripts/bench_under_load.py --out runs/under-load-quick --quick         # a smoke run (the test runs it)

Each measurement is one ``nas train-supernet SPACE`` run in a fresh process (its own OpenMP runtime: the wait policy
is read when torch starts), on a small seeded text file, its tokens/s the median of the per-step rates in its
``log.jsonl`` after ``--warmup`` steps.  The settings:

* ``before``: the defaults until issue 56: torch's threads (one per core) and OpenMP's own wait policy (threads spin
  at a barrier before they sleep); the command run without the ``nas`` entry point that now sets the policy;
* ``auto``: ``--threads auto`` alone (the CPUs free when the run starts), OpenMP's own policy;
* ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` alone (set by the entry point), one thread per core;
* ``after``: the defaults now (``python -m nas``: passive waiting and ``--threads auto``).

``spin30k``, ``spin3k`` (one thread per core, libgomp spinning ``GOMP_SPINCOUNT`` times before it sleeps, against its
default 300,000) and ``auto-spin3k`` (``--threads auto`` with the short spin) are measured when ``--settings`` names
them: a middle between spinning and sleeping at once.

Neighbours: ``none``, ``busy`` (a Python busy loop, one core) and ``niced`` (the same at nice 10), started before
the run and stopped after it; ``late``, the busy loop started once the run has logged its first step (its threads
already chosen: the case ``--threads auto`` alone cannot see; named by ``--neighbours``).  The target (issue 56):
with one of two cores held, ``after`` keeps at least 40% of its quiet tokens/s beside each neighbour.  Writes
``under_load.json`` (every run's tokens/s, threads chosen and load average) in ``--out``; a machine with one core
cannot hold a core for the neighbour, and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {  # name -> (through the nas entry point: passive waiting, --threads: None = the command's default, environment)
    "before": (False, "cores", {}),
    "auto": (False, "auto", {}),
    "passive": (True, "cores", {}),
    "after": (True, None, {}),
    # libgomp's spin before a waiting thread sleeps (GOMP_SPINCOUNT; its default 300,000 when no policy is set), shorter:
    "spin30k": (False, "cores", {"GOMP_SPINCOUNT": "30000"}),
    "spin3k": (False, "cores", {"GOMP_SPINCOUNT": "3000"}),
    "auto-spin3k": (False, "auto", {"GOMP_SPINCOUNT": "3000"}),
}
DEFAULT_SETTINGS = ("before", "auto", "passive", "after")
NEIGHBOURS = ("none", "busy", "niced", "late")
DEFAULT_NEIGHBOURS = ("none", "busy", "niced")
TARGET = 0.40  # after, beside a neighbour: at least this share of its quiet tokens/s
BUSY_LOOP = "while True: pass"
PLAIN_CLI = "import sys; from nas.cli import main; sys.exit(main(sys.argv[1:]))"  # nas without its entry point


def write_text(path: Path, kb: int, seed: int = 0) -> Path:
    """A seeded text file of ``kb`` KB of words (the corpus: its encoding is cached per run folder)."""
    rng = np.random.default_rng(seed)
    words = ["the", "of", "attention", "layer", "token", "search", "latency", "model", "train", "budget", "cache"]
    lines, size = [], 0
    while size < kb * 1024:
        line = " ".join(rng.choice(words, size=12)) + ".\n"
        lines.append(line)
        size += len(line)
    path.write_text("".join(lines))
    return path


def neighbour(kind: str) -> subprocess.Popen | None:
    """Start the neighbour process (None for ``none``); the caller stops it."""
    if kind == "none":
        return None
    if kind == "late":
        kind = "busy"
    nice = (lambda: os.nice(10)) if kind == "niced" else None
    return subprocess.Popen([sys.executable, "-c", BUSY_LOOP], preexec_fn=nice, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def command(setting: str, space: str, data: Path, out: Path, plan: dict) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of one measured run."""
    entry, threads, extra = SETTINGS[setting]
    cores = str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    steps = plan["warmup"] + plan["steps"]
    args = ["train-supernet", space, "--data", str(data), "--out", str(out), "--max-steps", str(steps),
            "--batch-size", str(plan["batch"]), "--seq-len", str(plan["seq"]), "--log-interval", "1",
            "--eval-interval", str(10 * steps), "--ckpt-interval", str(10 * steps), "--eval-batches", "1", "-q"]
    if threads is not None:
        args += ["--threads", cores if threads == "cores" else threads]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "nas", *args] if entry else [sys.executable, "-c", PLAIN_CLI, *args]
    return argv, env


def read_run(out: Path, warmup: int) -> dict:
    """tokens/s (the median per-step rate after ``warmup`` steps) and the threads the run recorded."""
    events = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if line.strip()]
    rates = [e["tokens_per_s"] for e in events if e.get("event") == "train" and e["step"] > warmup]
    start = next((e for e in events if e.get("event") == "start"), {})
    threads = start.get("meta", {}).get("train_config", {}).get("threads")
    return {"tokens_per_s": statistics.median(rates) if rates else None, "steps_timed": len(rates), "threads": threads}


def measure(setting: str, kind: str, space: str, data: Path, folder: Path, plan: dict) -> dict:
    """One run of ``setting`` beside the ``kind`` neighbour."""
    out = folder / f"{setting}-{kind}"
    shutil.rmtree(out, ignore_errors=True)  # a run of an earlier round or invocation: this one starts afresh
    argv, env = command(setting, space, data, out, plan)
    proc = None if kind == "late" else neighbour(kind)
    try:
        time.sleep(plan["settle_s"])  # the neighbour running before the run chooses its threads
        load = os.getloadavg()[0]
        t0 = time.time()
        run = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if kind == "late":  # once the run has logged a step (its threads chosen), the busy loop starts
            log = out / "log.jsonl"
            while run.poll() is None and not (log.exists() and '"event": "train"' in log.read_text()):
                time.sleep(0.05)
            proc = neighbour(kind)
        stdout, stderr = run.communicate()
        done = subprocess.CompletedProcess(argv, run.returncode, stdout, stderr)
        wall = time.time() - t0
    finally:
        stop(proc)
    if done.returncode != 0:
        raise SystemExit(f"bench_under_load: {' '.join(argv[:4])} ... exited {done.returncode}: {done.stderr[-2000:]}")
    return {**read_run(out, plan["warmup"]), "load_before": load, "wall_s": round(wall, 1),
            "neighbour_pid": None if proc is None else proc.pid}


PLANS = {
    "full": {"batch": 16, "seq": 128, "warmup": 5, "steps": 40, "rounds": 3, "settle_s": 2.0, "kb": 400},
    "quick": {"batch": 2, "seq": 16, "warmup": 1, "steps": 2, "rounds": 1, "settle_s": 0.2, "kb": 20},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for under_load.json and the runs")
    ap.add_argument("--space", default="tiny", help="the search space trained (default tiny)")
    ap.add_argument("--settings", help=f"comma-separated, of {', '.join(SETTINGS)} (default {', '.join(DEFAULT_SETTINGS)}; "
                    "--quick: before,after)")
    ap.add_argument("--neighbours", help=f"comma-separated, of {', '.join(NEIGHBOURS)} (default {', '.join(DEFAULT_NEIGHBOURS)})")
    ap.add_argument("--rounds", type=int, help="rounds over every (setting, neighbour); the median counts (default 3)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: a tiny batch, 3 steps, one round")
    args = ap.parse_args(argv)
    plan = dict(PLANS["quick" if args.quick else "full"])
    settings = [s.strip() for s in (args.settings or ("before,after" if args.quick else ",".join(DEFAULT_SETTINGS))).split(",")]
    neighbours = [n.strip() for n in (args.neighbours or ",".join(DEFAULT_NEIGHBOURS)).split(",")]
    problems = [f"--settings: {s!r} is not one of {', '.join(SETTINGS)}" for s in settings if s not in SETTINGS]
    problems += [f"--neighbours: {n!r} is not one of {', '.join(NEIGHBOURS)}" for n in neighbours if n not in NEIGHBOURS]
    if args.rounds is not None and args.rounds < 1:
        problems.append(f"--rounds: {args.rounds} is not a positive number")
    if problems:
        print(f"bench_under_load: {problems[0]}", file=sys.stderr)
        return 2
    plan["rounds"] = args.rounds or plan["rounds"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = write_text(out / "data.txt", plan["kb"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    started, load_start = time.time(), os.getloadavg()[0]
    runs: dict[str, dict[str, list[dict]]] = {s: {n: [] for n in neighbours} for s in settings}
    for r in range(plan["rounds"]):
        for kind in neighbours:  # settings interleaved within a round: drift on the machine hits each alike
            for setting in settings:
                runs[setting][kind].append(measure(setting, kind, args.space, data, out / "runs", plan))
                last = runs[setting][kind][-1]
                print(f"round {r + 1}: {setting:8s} beside {kind:6s}: {last['tokens_per_s'] or 0:10.0f} tokens/s "
                      f"({last['threads']} threads, load {last['load_before']:.2f})", flush=True)
    results = {}
    for setting, by_kind in runs.items():
        results[setting] = {}
        for kind, rs in by_kind.items():
            rates = [r["tokens_per_s"] for r in rs if r["tokens_per_s"] is not None]
            results[setting][kind] = {"tokens_per_s": statistics.median(rates) if rates else None,
                                      "threads": [r["threads"] for r in rs], "runs": rs}
        quiet = results[setting].get("none", {}).get("tokens_per_s")
        for kind in by_kind:
            mine = results[setting][kind]["tokens_per_s"]
            results[setting][kind]["vs_quiet"] = mine / quiet if quiet and mine is not None else None
    targets = {}
    if "after" in results and "none" in neighbours:
        for kind in ("busy", "niced", "late"):
            share = results["after"].get(kind, {}).get("vs_quiet")
            if share is not None:
                targets[kind] = {"vs_quiet": share, "target": TARGET, "met": share >= TARGET}
    note = None if cores >= 2 else "one CPU: a neighbour cannot hold a core of its own; the loaded figures are not the target's"
    doc = {"command": " ".join(["python", "scripts/bench_under_load.py", *(argv if argv is not None else sys.argv[1:])]),
           "machine": {"cpus": cores, "processor": platform.processor() or platform.machine(),
                       "python": platform.python_version()},
           "plan": plan, "space": args.space, "settings": {s: {"passive": SETTINGS[s][0], "threads": SETTINGS[s][1],
                                                                "environment": SETTINGS[s][2]} for s in settings},
           "load_start": load_start, "load_end": os.getloadavg()[0], "wall_s": round(time.time() - started, 1),
           "results": results, "targets": targets, "note": note}
    (out / "under_load.json").write_text(json.dumps(doc, indent=1) + "\n")
    for setting, by_kind in results.items():
        print(f"{setting:8s} " + "  ".join(
            f"{kind}: {v['tokens_per_s'] or 0:.0f} tokens/s" + (f" ({v['vs_quiet']:.0%} of quiet)" if v["vs_quiet"] else "")
            for kind, v in by_kind.items()))
    for kind, t in targets.items():
        print(f"target: after beside {kind} >= {TARGET:.0%} of quiet: {t['vs_quiet']:.0%}, {'met' if t['met'] else 'missed'}")
    if note:
        print(f"note: {note}")
    print(f"wrote {out / 'under_load.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

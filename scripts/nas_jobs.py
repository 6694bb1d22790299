"""Running ``nas`` command lines from a benchmark, several at a time: each training on one thread, so ``jobs`` of them
use ``jobs`` cores (two one-thread trainings side by side do about twice the work of one two-thread training on the
2-core machines the benchmarks are sized for).  Shared by the benchmarks that retrain many models."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def train_subnet_argv(subnet, out: Path, flags: list[str]) -> list[str]:
    """``nas train-subnet`` of ``subnet`` into the model folder ``out`` with ``flags`` (the subnet written to
    ``OUT.yaml`` beside the folder), continued with ``--resume`` when an interrupted run left its checkpoint
    (``supernet.runs.resumable``)."""
    from supernet.runs import resumable

    out.parent.mkdir(parents=True, exist_ok=True)
    subnet_file = out.parent / f"{out.name}.yaml"
    subnet_file.write_text(subnet.to_yaml())
    return ["train-subnet", str(subnet_file), "--out", str(out), *flags] + (["--resume"] if resumable(out) else [])


def child_env(argv: list[str]) -> dict[str, str]:
    """A ``nas`` child's environment: ``OMP_NUM_THREADS`` set to its ``--threads`` where it names them, so the OpenMP
    pools outside torch's keep to them too (two one-thread trainings side by side must not spin extra threads)."""
    env = dict(os.environ)
    if "--threads" in argv[:-1]:
        env["OMP_NUM_THREADS"] = argv[argv.index("--threads") + 1]
    return env


def run_nas(argvs: list[list[str]], jobs: int, logs: list[Path] | None = None) -> None:
    """Each ``nas`` command line, ``jobs`` at a time: in this process when one at a time, else each in its own
    ``python -m nas``.  A command that fails stops the rest from starting and is named in one line
    (``search_spaces.UserError``); a run stopped by Ctrl-C or SIGTERM stops the running commands (a training saves
    its checkpoint and resumes with ``--resume``) and starts no other.

    ``logs`` (a file per command): every command runs in its own process from the caller's folder, its output appended
    to its log after a ``$ nas ...`` line, and one line is printed as each ends (the log named where it failed)."""
    from nas.cli import main as nas
    from search_spaces import UserError

    if jobs == 1 and logs is None:
        for argv in argvs:
            if nas(argv) != 0:
                raise UserError(f"`nas {' '.join(argv)}` failed; fix the cause above and run again to resume")
        return
    if logs is not None and len(logs) != len(argvs):
        raise ValueError(f"run_nas: {len(logs)} logs for {len(argvs)} commands")
    stop, lock, procs = threading.Event(), threading.Lock(), []

    def one(i: int) -> int | None:
        argv, log = argvs[i], logs[i] if logs is not None else None
        with lock:
            if stop.is_set():
                return None
            if log is None:
                proc = subprocess.Popen([sys.executable, "-m", "nas", *argv], cwd=ROOT, env=child_env(argv))
            else:
                log.parent.mkdir(parents=True, exist_ok=True)
                with open(log, "a") as f:
                    f.write("$ nas " + shlex.join(argv) + "\n")
                    f.flush()
                    proc = subprocess.Popen([sys.executable, "-m", "nas", *argv], stdout=f, stderr=subprocess.STDOUT,
                                            env=child_env(argv))
            procs.append(proc)
        started = time.monotonic()
        rc = proc.wait()
        if rc != 0:
            stop.set()
        if log is not None:
            ended = "done" if rc == 0 else f"failed (exit {rc}; its log: {log})"
            print(f"[{time.strftime('%H:%M:%S')}] nas {argv[0]} {ended} in {time.monotonic() - started:.0f} s: {log.parent}",
                  flush=True)
        return rc

    def stopped(signum, frame):  # SIGTERM unwinds like Ctrl-C, so the children are stopped below
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stopped) if threading.current_thread() is threading.main_thread() else None
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        codes = list(pool.map(one, range(len(argvs))))
    finally:
        with lock:
            stop.set()
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
        pool.shutdown(wait=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    failed = [i for i, rc in enumerate(codes) if rc not in (0, None)]
    if failed:
        where = f"its log: {logs[failed[0]]}; fix the cause" if logs is not None else "fix the cause above"
        raise UserError(f"`nas {' '.join(argvs[failed[0]])}` failed; {where} and run again to resume")

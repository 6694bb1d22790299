"""scripts/nas_jobs.py: commands several at a time; a failure stops the rest from starting and is named."""

import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import nas_jobs  # noqa: E402

from search_spaces import UserError  # noqa: E402


class FakeProc:
    """A command that ends with ``rc`` after ``seconds`` (or when terminated)."""

    def __init__(self, rc: int, seconds: float):
        self.rc, self.done = rc, threading.Event()
        self.timer = threading.Timer(seconds, self.done.set)
        self.timer.start()
        self.terminated = False

    def wait(self):
        self.done.wait()
        return -15 if self.terminated else self.rc

    def poll(self):
        return (-15 if self.terminated else self.rc) if self.done.is_set() else None

    def terminate(self):
        self.terminated = True
        self.done.set()


def test_a_failed_command_stops_the_rest_from_starting_and_is_named(monkeypatch):
    started = []
    plan = {"bad": (2, 0.05), "slow": (0, 0.3), "next": (0, 0.0), "last": (0, 0.0)}

    def popen(cmd, cwd=None, env=None):
        started.append(cmd[-1])
        return FakeProc(*plan[cmd[-1]])

    monkeypatch.setattr(nas_jobs.subprocess, "Popen", popen)
    with pytest.raises(UserError) as e:
        nas_jobs.run_nas([["x", name] for name in plan], 2)
    assert str(e.value) == "`nas x bad` failed; fix the cause above and run again to resume"
    assert started == ["bad", "slow"]  # the running one finished; none started after the failure


def test_all_commands_run_jobs_at_a_time(monkeypatch):
    running, peak, started = [0], [0], []
    lock = threading.Lock()

    class Counting(FakeProc):
        def wait(self):
            rc = super().wait()
            with lock:
                running[0] -= 1
            return rc

    def popen(cmd, cwd=None, env=None):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        started.append(cmd[-1])
        return Counting(0, 0.05)

    monkeypatch.setattr(nas_jobs.subprocess, "Popen", popen)
    t0 = time.perf_counter()
    nas_jobs.run_nas([["x", str(i)] for i in range(5)], 2)
    assert sorted(started) == [str(i) for i in range(5)] and peak[0] == 2 and time.perf_counter() - t0 < 5


def test_sigterm_stops_the_running_commands_and_starts_no_other(monkeypatch):
    import os
    import signal

    procs = []

    def popen(cmd, cwd=None, env=None):
        procs.append(FakeProc(0, 30.0))  # would run 30 s
        return procs[-1]

    monkeypatch.setattr(nas_jobs.subprocess, "Popen", popen)
    before = signal.getsignal(signal.SIGTERM)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as e:
        nas_jobs.run_nas([["x", str(i)] for i in range(4)], 2)
    assert e.value.code == 128 + signal.SIGTERM and time.perf_counter() - t0 < 10
    assert len(procs) == 2 and all(p.terminated for p in procs)  # the two running stopped, the other two never began
    assert signal.getsignal(signal.SIGTERM) == before  # the handler put back


def test_with_logs_each_command_writes_its_own_log_and_a_failure_names_it(monkeypatch, tmp_path, capsys):
    """``logs``: each command's output goes to its file after a ``$ nas ...`` line (even one at a time), a line is
    printed as each ends, and a failed one is named with its log."""
    plan = {"ok": 0, "bad": 3}

    def popen(cmd, stdout=None, stderr=None, env=None):
        stdout.write(f"output of {cmd[-1]}\n")
        assert env["OMP_NUM_THREADS"] == "1"  # the command's --threads, for OpenMP's pools too
        return FakeProc(plan[cmd[-1]], 0.0)

    monkeypatch.setattr(nas_jobs.subprocess, "Popen", popen)
    logs = [tmp_path / name / "log.txt" for name in plan]
    with pytest.raises(UserError) as e:
        nas_jobs.run_nas([["train-subnet", "--threads", "1", name] for name in plan], 1, logs=logs)
    assert str(e.value) == f"`nas train-subnet --threads 1 bad` failed; its log: {logs[1]}; fix the cause and run again to resume"
    assert logs[0].read_text() == "$ nas train-subnet --threads 1 ok\noutput of ok\n"
    assert logs[1].read_text() == "$ nas train-subnet --threads 1 bad\noutput of bad\n"
    printed = capsys.readouterr().out
    assert f"nas train-subnet done in 0 s: {tmp_path / 'ok'}\n" in printed
    assert f"nas train-subnet failed (exit 3; its log: {logs[1]}) in 0 s: {tmp_path / 'bad'}\n" in printed

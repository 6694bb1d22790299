"""How many CPU threads a run should use here: the CPUs this process may run on and its cgroup's quota, less what
other processes keep busy right now (``--threads auto``, the default of the training commands).

Why: a training step of a small model is many small operators, each split over the threads, which meet at an OpenMP
barrier after each.  Where another process holds one of the cores, the thread that shares it arrives late at every
barrier: two threads on two cores ran at 34% of their quiet tokens/s beside a busy loop and at 2% beside a niced
emulator (issue 56), where one thread on the free core keeps most of it.  So ``auto`` asks for the CPUs that are
free: a CPU counts as taken when another process keeps it at least ``TAKEN`` busy.

The busy share comes from two readings of ``/proc/stat`` a moment apart (this process asleep between them, so its
own threads are not counted); where there is no ``/proc/stat``, from the 1-minute load average (which lags a
minute).  Niced work counts as busy: a niced neighbour still preempts a spinning thread often enough to collapse a
step (the 2% above).  The choice is made once per process (:func:`auto_threads`), so the runs of one process sum
alike.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

TAKEN = 0.7  # a CPU's worth of other work at least this busy is not offered to the run
SAMPLE_S = 0.1  # the time between the two readings of /proc/stat


@dataclass(frozen=True)
class Share:
    """What the choice saw: the CPUs this process may use, the cgroup quota in CPUs (None: none), the CPUs other
    processes keep busy and from where that was read, and the threads chosen."""

    cpus: int
    quota: float | None
    busy: float
    source: str  # "/proc/stat", "load average" or "none"
    threads: int

    def describe(self) -> str:
        quota = f", cgroup quota {self.quota:g} CPUs" if self.quota is not None else ""
        return (f"{self.threads} thread{'s' if self.threads != 1 else ''} (auto: {self.cpus} CPUs{quota}, "
                f"{self.busy:.1f} busy with other work by {self.source})")


def parse_cpu_max(text: str) -> float | None:
    """A cgroup v2 ``cpu.max`` ("QUOTA PERIOD", or "max PERIOD" for none) as CPUs, e.g. "150000 100000" -> 1.5."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = float(parts[0]), float(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def cpu_quota(cgroup_file: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup, in CPUs (the tightest on its path up to the root; cgroup v2's
    ``cpu.max`` or v1's ``cpu.cfs_quota_us / cpu.cfs_period_us``); None where there is none or it cannot be read."""
    try:
        lines = cgroup_file.read_text().splitlines()
    except OSError:
        return None
    found: list[float] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # cgroup v2: "0::/path"
            folders = [root / path.lstrip("/")] + list((root / path.lstrip("/")).parents)
            for folder in folders:
                if folder == root.parent:
                    break
                try:
                    q = parse_cpu_max((folder / "cpu.max").read_text())
                except OSError:
                    continue
                if q is not None:
                    found.append(q)
        elif "cpu" in controllers.split(","):  # cgroup v1: "N:cpu,cpuacct:/path"
            base = root / controllers
            for folder in (base / path.lstrip("/"), base):
                try:
                    quota = float((folder / "cpu.cfs_quota_us").read_text())
                    period = float((folder / "cpu.cfs_period_us").read_text())
                except (OSError, ValueError):
                    continue
                if quota > 0 and period > 0:
                    found.append(quota / period)
    return min(found) if found else None


def cpu_times(stat: str, cpus: set[int]) -> tuple[float, float]:
    """(busy, total) clock ticks of ``/proc/stat``'s per-CPU lines for ``cpus``: busy is all but idle and iowait."""
    busy = total = 0.0
    for line in stat.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        ticks = [float(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


def busy_cpus(cpus: set[int], wait: float = SAMPLE_S, read: Callable[[], str] | None = None,
              sleep: Callable[[float], None] = time.sleep) -> float | None:
    """CPUs of ``cpus`` kept busy over ``wait`` seconds, from two readings of ``/proc/stat`` (None without it)."""
    read = read or (lambda: Path("/proc/stat").read_text())
    try:
        b0, t0 = cpu_times(read(), cpus)
        sleep(wait)
        b1, t1 = cpu_times(read(), cpus)
    except (OSError, ValueError):
        return None
    if t1 <= t0:
        return None
    return len(cpus) * (b1 - b0) / (t1 - t0)


def choose_threads(cpus: int, quota: float | None, busy: float) -> int:
    """Threads for a run: the CPUs other work leaves free (one counts when less than ``TAKEN`` of it is busy), at most
    the quota (rounded down), at least 1."""
    usable = cpus if quota is None else max(1, min(cpus, math.floor(quota + 1e-9)))
    taken = math.floor(busy + (1 - TAKEN) + 1e-9)  # 0.6 of a CPU busy: none taken; 0.7 to 1.6: one; ...
    return max(1, min(usable, cpus - taken))


def cpu_share(wait: float = SAMPLE_S) -> Share:
    """Read this machine's share for a run now (affinity, quota, busy CPUs) and choose its threads."""
    affinity = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    quota = cpu_quota()
    busy, source = busy_cpus(affinity, wait), "/proc/stat"
    if busy is None and hasattr(os, "getloadavg"):
        busy, source = min(float(len(affinity)), os.getloadavg()[0]), "load average"
    if busy is None:
        busy, source = 0.0, "none"
    busy = max(0.0, busy)
    return Share(len(affinity), quota, busy, source, choose_threads(len(affinity), quota, busy))


@lru_cache(maxsize=1)
def auto_threads() -> Share:
    """:func:`cpu_share`, chosen once per process (every run of the process then sums alike)."""
    return cpu_share()

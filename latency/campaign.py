"""A measurement campaign: many subnets of a space, in memory-bounded chunks, appended to a table.

One short driver: for each pass (``measure``, then ``retest``), the subnets not yet in the
table are split into chunks whose weights fit ``memory_mb``; each chunk is extracted, timed
interleaved by :func:`latency.protocol.measure`, and appended.  Inside a chunk every visit reaches
disk as it finishes (a journal beside the table, ``TABLE.csv.visits``), so a campaign killed at any
point (kill -9, Ctrl-C, a full disk) resumes where it was and ends with the rows an uninterrupted
campaign writes.  The drift baseline of the first chunk anchors every later chunk and every resumed run.
The table is locked while the campaign runs (:class:`latency.table.TimingTable`) and released when it returns.
"""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from search_spaces import Space, Subnet, UserError, Workload, tasks

from .device import Device
from .protocol import measure
from .table import TimingTable
from .timing_core import Journal, Settings, format_row

log = logging.getLogger(__name__)


def chunks(subnets: list[Subnet], space: Space, memory_mb: float) -> list[list[Subnet]]:
    """Consecutive groups whose fp32 weights together stay under ``memory_mb`` (at least one subnet each)."""
    out: list[list[Subnet]] = []
    used = memory_mb + 1
    count = tasks.of(space).params
    for s in subnets:
        mb = count(space, s) * 4 / 2**20
        if used + mb > memory_mb and (not out or out[-1]):
            out.append([])
            used = 0.0
        out[-1].append(s)
        used += mb
    return [c for c in out if c]


def check_memory(space: Space, chunk: list[Subnet]) -> None:
    """Refuse, before allocating, a chunk whose fp32 weights need more memory than the machine has free."""
    import os

    count = tasks.of(space).params
    need = sum(count(space, s) for s in chunk) * 4
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on every platform
        return
    if need > free:
        big = max(chunk, key=lambda s: count(space, s))
        raise UserError(
            f"the weights of {len(chunk)} subnet(s) need {need / 2**20:,.0f} MB, {free / 2**20:,.0f} MB of memory are free "
            f"(the largest: {big}, {count(space, big):,} parameters); lower --memory-mb or time a space of smaller models"
        )


def run_campaign(
    device: Device,
    space: Space,
    workload: Workload,
    passes: dict[str, list[Subnet]],
    table: TimingTable,
    settings: Settings,
    *,
    seed: int,
    memory_mb: float = 2048,
    progress: Callable[[int, int, str], None] | None = None,
) -> int:
    """Measure every subnet of every pass not yet in ``table``; return how many were measured.  Releases the
    table's lock when it returns or fails."""
    try:
        return _run(device, space, workload, passes, table, settings, seed, memory_mb, progress)
    finally:
        table.close()


def _run(device, space, workload, passes, table, settings, seed, memory_mb, progress) -> int:
    todo = {p: [s for s in subs if s.key not in table.done[p]] for p, subs in passes.items()}
    total = sum(len(v) for v in todo.values()) * settings.rounds
    if not total:
        table.journal_path.unlink(missing_ok=True)
        return 0
    task = tasks.of(space)  # the static models, the reference and a row's features are the task's
    build, features, ref = task.timing_model, task.table_features, task.timing_reference(space)
    materialize = getattr(device, "needs_weights", True)  # ONNX Runtime draws its own: no torch weights needed
    if materialize:  # every chunk checked before the first is built: a huge subnet is refused before anything is timed
        for subnets in todo.values():
            for chunk in chunks(subnets, space, memory_mb):
                check_memory(space, chunk)
    visits = 0  # visits made so far (retries of disturbed visits add to the planned total)
    for p_index, (pass_, subnets) in enumerate(passes.items()):
        # chunks of the whole pass (not of what is left), so a resumed campaign has the chunks and seeds of an uninterrupted one
        for c_index, whole in enumerate(chunks(subnets, space, memory_mb)):
            chunk = [s for s in whole if s.key not in table.done[pass_]]
            if not chunk:
                continue
            chunk_seed = int(np.random.default_rng([seed, p_index, c_index]).integers(2**31))
            journal = Journal(str(table.journal_path), {"pass": pass_, "chunk": c_index, "keys": [s.key for s in chunk],
                                                        "seed": chunk_seed})
            if journal.entries:
                log.info("%s: resuming %d visits of an interrupted chunk", table.journal_path, len(journal.entries))
            models = {s.key: build(space, s, materialize=materialize) for s in chunk}
            last = 0

            def tick(d: int, _t: int, key: str) -> None:
                nonlocal visits, last, total
                visits, last = visits + d - last, d
                total = max(total, visits)
                if progress is not None:
                    progress(visits, total, f"{pass_} {key}")

            m = measure(
                device, models, workload, settings, seed=chunk_seed,
                reference=ref, baseline_ms=table.baseline_ms, progress=tick, journal=journal,
            )
            if table.baseline_ms is None:
                table.set_baseline(m.baseline_ms)
            rows = [
                format_row(s.key, pass_, s.to_json(), features(space, s, workload), m.results[s.key], workload.label)
                for s in chunk
            ]
            table.append(rows, pass_)
            journal.remove()
            del models
    return sum(len(v) for v in todo.values())

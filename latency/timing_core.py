"""The timing protocol's core: standard library and numpy only.

This file is self-contained on purpose: the ARM bundle's runner is this file's text
followed by ``devices/bundle_main.py``, so the board runs exactly the protocol the host
runs (and the host and the board write the same CSV).  Nothing here imports torch,
onnxruntime or another module of this project.

A *runner* is any callable ``runner(n) -> seconds`` that runs its model ``n`` times back to
back and returns the elapsed wall time, synchronised (a device owns how it times: perf_counter
on a CPU, CUDA events after a synchronisation on a GPU, a fake clock in tests).

The protocol, built for shared and noisy machines:

1. Calibrate: ``warmup`` untimed calls per model, then pick ``calls`` per sample so that
   one sample (a timed batch of back-to-back calls) lasts at least ``min_sample_ms``.
2. ``rounds`` rounds; each visits every model once, in a freshly shuffled order.  A visit
   times the fixed *reference* model (``ref_samples`` samples), makes one untimed call of the
   model (caches after a switch), takes ``ceil(repeats / rounds)`` samples, and times one more
   reference sample: the visit is bracketed.
3. Drift: each visit's samples are rescaled by ``baseline / reference-at-that-visit`` (the
   geometric mean of the reference before and after), so a machine that is 2x slower for a while
   reports the same numbers.  The baseline is the median reference time of the first calibration
   (kept in the sidecar, reused on resume and by every later chunk).  ``paired``: a reference
   sample follows every sample, and each sample is rescaled by the two reference samples around
   it instead; this follows speed swings faster than a visit (a shared host's), at twice the
   timing cost (``scripts/bench_protocol.py`` compares the three readings side by side).
4. Interference: a visit during which the machine changed (the reference after it differs from
   the one before by more than ``tolerance``, or its samples spread wider than that) is redone
   after the rounds, up to ``max_retries`` times; a subnet still disturbed is flagged ``interference``.
5. Per model: the median of each round's samples, combined over rounds by ``combine``
   (``min`` of round medians, or their ``median``), the interquartile range of all samples kept.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from typing import Callable, Iterable

import numpy as np

Runner = Callable[[int], float]

# How a runner reads time.  "wall": elapsed time, what a dedicated device sees.  "cpu": the calling
# thread's CPU time, which a shared machine does not inflate when it deschedules us (the forward is
# the same work either way); valid only when that one thread does all the work (--threads 1).
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def check_clock(clock: str, threads: object) -> None:
    if clock not in CLOCKS:
        raise ValueError(f"--clock: {clock!r} is not one of {', '.join(CLOCKS)}")
    if clock == "cpu" and threads != 1:
        raise ValueError(
            f"--clock cpu needs --threads 1 (got {threads}): a thread's CPU time is the latency only when that one thread does "
            "all the work"
        )


Progress = Callable[[int, int, str], None]

REFERENCE = "<reference>"
FLAG_INTERFERENCE = "interference"  # a visit stayed disturbed after every retry
FLAG_NOISY = "noisy"  # IQR wider than the tolerance around the median
FLAG_LOAD = "load"  # the 1-minute load average exceeded the core count during a visit

# Columns of a timing table, after the subnet's feature columns (see TIMING_COLUMNS below).
HEAD_COLUMNS = ["key", "pass", "workload", "subnet"]  # workload: the label of what was timed (a table holds one)
TIMING_COLUMNS = ["median_ms", "iqr_ms", "raw_median_ms", "round_ms", "repeats", "rounds", "calls", "ref_ratio", "load", "flags"]
FORMAT = "nas-latency-timings"
VERSION = 1


@dataclass(frozen=True)
class Settings:
    """What the protocol does; stored in the timing table's sidecar and checked on resume."""

    warmup: int = 10  # untimed calls per model before its first round
    repeats: int = 30  # timed samples per model in all (spread over the rounds)
    rounds: int = 5  # interleaved rounds, each in a new shuffled order
    min_sample_ms: float = 30.0  # a sample times enough back-to-back calls to last at least this long
    ref_samples: int = 2  # reference samples before each visit (and one after)
    tolerance: float = 0.15  # a visit is disturbed if the reference after it differs from the one before by more
    max_retries: int = 1  # re-measure passes for disturbed visits
    combine: str = "median"  # round medians -> one number: "median" or "min"
    correct_drift: bool = True  # rescale samples by baseline / reference at that visit
    paired: bool = False  # bracket every sample by reference samples and rescale it by theirs (not the visit's)

    def __post_init__(self) -> None:
        for name in ("warmup", "max_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("repeats", "rounds", "ref_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.min_sample_ms < 0 or not 0 < self.tolerance < 1:
            raise ValueError(f"min_sample_ms must be >= 0 and tolerance in (0, 1), got {self.min_sample_ms}, {self.tolerance}")
        if self.combine not in ("median", "min"):
            raise ValueError(f"combine must be 'median' or 'min', got {self.combine!r}")
        if self.paired and not self.correct_drift:
            raise ValueError("paired needs drift correction: it rescales every sample by the reference samples beside it")

    @property
    def per_round(self) -> int:
        return -(-self.repeats // self.rounds)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Settings":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Visit:
    """One model's samples in one round (per-call milliseconds, raw) and the reference beside them."""

    round: int
    samples: list[float]
    ref_ms: float  # the reference before the samples (median of ref_samples)
    load: float
    ref_after_ms: float | None = None  # one reference sample right after
    sample_refs: list[float] | None = (
        None  # paired: per sample, the reference level beside it (geometric mean of the two around it)
    )


@dataclass
class Result:
    """What the protocol concludes about one model."""

    median_ms: float
    iqr_ms: float
    raw_median_ms: float
    round_ms: list[float]
    repeats: int
    rounds: int
    calls: int
    ref_ratio: float
    load: float
    flags: list[str]


# --------------------------------------------------------------------------- statistics (pure)


def iqr(values: Iterable[float]) -> float:
    q1, q3 = np.percentile(np.asarray(list(values), dtype=np.float64), [25, 75])
    return float(q3 - q1)


def visit_ref(visit: Visit) -> float:
    """The reference level during a visit: geometric mean of the reference before and after it."""
    if visit.ref_after_ms is None:
        return visit.ref_ms
    return math.sqrt(visit.ref_ms * visit.ref_after_ms)


def disturbed(visit: Visit, tolerance: float) -> bool:
    """The machine changed during this visit: the reference after it disagrees with the one before,
    or the samples themselves spread wider than ``tolerance`` around their median.  (A machine that
    is uniformly slower for a while is drift, corrected by the reference, not a disturbance.)"""
    if visit.sample_refs is not None:  # paired: every sample has its own reference, so only their ratios must agree
        changed, values = False, [s / r for s, r in zip(visit.samples, visit.sample_refs)]
    else:
        changed = visit.ref_after_ms is not None and abs(visit.ref_after_ms / visit.ref_ms - 1.0) > tolerance
        values = visit.samples
    med = float(np.median(values))
    if len(values) >= 4:
        spread = iqr(values) > tolerance * med
    else:
        spread = max(values) - min(values) > tolerance * med
    return changed or spread


def summarise(
    visits: list[Visit], calls: int, baseline_ms: float, settings: Settings, cores: int, still_disturbed: bool
) -> Result:
    """Combine one model's kept visits into its :class:`Result`."""
    def corrected_samples(v: Visit) -> list[float]:
        if not settings.correct_drift:
            return list(v.samples)
        if v.sample_refs is not None:
            return [s * baseline_ms / r for s, r in zip(v.samples, v.sample_refs)]
        return [s * baseline_ms / visit_ref(v) for s in v.samples]

    corrected = [corrected_samples(v) for v in visits]
    round_ms = [float(np.median(c)) for c in corrected]
    raw_round = [float(np.median(v.samples)) for v in visits]
    pick = min if settings.combine == "min" else (lambda xs: float(np.median(xs)))
    pooled = [s for c in corrected for s in c]
    median = float(pick(round_ms))
    flags = []
    if still_disturbed:
        flags.append(FLAG_INTERFERENCE)
    if iqr(pooled) > settings.tolerance * median:
        flags.append(FLAG_NOISY)
    if max(v.load for v in visits) > cores:
        flags.append(FLAG_LOAD)
    return Result(
        median_ms=median,
        iqr_ms=iqr(pooled),
        raw_median_ms=float(pick(raw_round)),
        round_ms=round_ms,
        repeats=len(pooled),
        rounds=len(visits),
        calls=calls,
        ref_ratio=float(np.mean([visit_ref(v) / baseline_ms for v in visits])),
        load=float(np.mean([v.load for v in visits])),
        flags=flags,
    )


# --------------------------------------------------------------------------- the driver


def _loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return 0.0


def _per_call_ms(runner: Runner, calls: int) -> float:
    return runner(calls) / calls * 1000.0


def calibrate(runner: Runner, settings: Settings) -> int:
    """Warm ``runner`` up and return how many calls make one sample of at least ``min_sample_ms``."""
    runner(max(settings.warmup, 1))
    estimate = min(_per_call_ms(runner, 1) for _ in range(3))
    return max(1, math.ceil(settings.min_sample_ms / max(estimate, 1e-6)))


def run_protocol(
    runners: dict[str, Runner],
    reference: Runner,
    settings: Settings,
    rng: np.random.Generator,
    *,
    baseline_ms: float | None = None,
    load: Callable[[], float] = _loadavg,
    cores: int | None = None,
    progress: Progress | None = None,
) -> tuple[dict[str, Result], float]:
    """Time every runner by the protocol above; return ``({key: Result}, baseline_ms)``.

    ``baseline_ms`` anchors the drift correction; pass the one an earlier call returned so
    that chunks of one campaign (and a resumed campaign) share it.
    """
    cores = cores or os.cpu_count() or 1
    keys = list(runners)
    ref_calls = calibrate(reference, settings)

    def ref_ms() -> float:
        return float(np.median([_per_call_ms(reference, ref_calls) for _ in range(settings.ref_samples)]))

    if baseline_ms is None:
        baseline_ms = float(np.median([ref_ms() for _ in range(5)]))
    calls = {k: calibrate(runners[k], settings) for k in keys}
    total = len(keys) * settings.rounds
    done = 0

    def visit(key: str, rnd: int) -> Visit:
        nonlocal done
        ref = ref_ms()
        runners[key](1)  # untimed: the first call after another model ran meets cold caches
        if settings.paired:  # ref, s1, r1, s2, r2, ...: each sample between two reference samples
            samples, refs = [], [ref]
            for _ in range(settings.per_round):
                samples.append(_per_call_ms(runners[key], calls[key]))
                refs.append(_per_call_ms(reference, ref_calls))
            pairs = [math.sqrt(a * b) for a, b in zip(refs, refs[1:])]
            v = Visit(rnd, samples, ref, load(), refs[-1], pairs)
        else:
            samples = [_per_call_ms(runners[key], calls[key]) for _ in range(settings.per_round)]
            v = Visit(rnd, samples, ref, load(), _per_call_ms(reference, ref_calls))
        done += 1
        if progress is not None:
            progress(done, total, key)
        return v

    visits: dict[str, list[Visit]] = {k: [] for k in keys}
    for rnd in range(settings.rounds):
        for i in rng.permutation(len(keys)):
            visits[keys[i]].append(visit(keys[i], rnd))

    bad = {(k, j) for k in keys for j, v in enumerate(visits[k]) if disturbed(v, settings.tolerance)}
    for _ in range(settings.max_retries):
        if not bad:
            break
        todo = sorted(bad)
        total += len(todo)
        for i in rng.permutation(len(todo)):
            k, j = todo[i]
            v = visit(k, visits[k][j].round)
            if not disturbed(v, settings.tolerance):
                visits[k][j] = v
                bad.discard((k, j))
    results = {
        k: summarise(visits[k], calls[k], baseline_ms, settings, cores, any((k, j) in bad for j in range(len(visits[k]))))
        for k in keys
    }
    return results, baseline_ms


# --------------------------------------------------------------------------- table rows and sidecar (writing)


def format_row(
    key: str, pass_: str, subnet_json: str, features: dict[str, float], result: Result, workload: str = ""
) -> dict[str, str]:
    row = {"key": key, "pass": pass_, "workload": workload, "subnet": subnet_json}
    row.update({name: repr(float(v)) if isinstance(v, float) else str(v) for name, v in features.items()})
    row.update(
        median_ms=f"{result.median_ms:.6g}",
        iqr_ms=f"{result.iqr_ms:.6g}",
        raw_median_ms=f"{result.raw_median_ms:.6g}",
        round_ms=";".join(f"{x:.6g}" for x in result.round_ms),
        repeats=str(result.repeats),
        rounds=str(result.rounds),
        calls=str(result.calls),
        ref_ratio=f"{result.ref_ratio:.4f}",
        load=f"{result.load:.2f}",
        flags=";".join(result.flags),
    )
    return row


def append_rows(path: str, columns: list[str], rows: list[dict[str, str]]) -> None:
    """Append ``rows`` to the CSV at ``path`` (writing the header first if the file is new), then fsync.
    Keys not in ``columns`` are left out (a table written before a column existed keeps its header)."""
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
        if new:
            writer.writeheader()
        for row in rows:
            writer.writerow(row)
        f.flush()
        os.fsync(f.fileno())


def sidecar_path(csv_path: str) -> str:
    return csv_path + ".json"


def write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def host_facts() -> dict:
    """What every device fingerprint starts with: OS, machine, CPU model and cores, Python, hostname."""
    return {
        "os": platform.system(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "hostname": platform.node(),
    }


def cpu_model() -> str:
    """The CPU's marketing name (Linux /proc/cpuinfo; 'unknown' elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Hardware", "Processor", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# --------------------------------------------------------------------------- ONNX weights (graphs ship without them)


def materialize_weights(path: str, tensors: list[dict], seed: int = 0) -> None:
    """Write random weights for a weight-stripped ONNX graph: ``tensors`` lists offset, nbytes, dtype.

    Timing does not depend on weight values, so the graphs travel without them (a few hundred
    KB instead of up to hundreds of MB each) and the weights are drawn here: one seeded block of
    N(0, 0.02) values, tiled (drawing hundreds of MB afresh would cost seconds per model).
    """
    block = np.random.default_rng(seed).standard_normal(1 << 18, dtype=np.float32) * 0.02  # 1 MB
    with open(path, "wb") as f:
        for t in tensors:
            data = block.astype(t["dtype"]).tobytes()
            f.seek(t["offset"])
            left = t["nbytes"]
            while left > 0:
                f.write(data[: min(left, len(data))])
                left -= min(left, len(data))


def decode_inputs(layout: dict, batch_size: int, context: int, seed: int = 0) -> dict:
    """ONNX Runtime inputs for timing one decode step at ``context`` tokens seen, from a step graph's input
    layout (``supernet.onnx_decode.input_layout``: name -> shape with "batch" / "past" axes, dtype).

    The token is random, the position is ``context``, states are N(0, 1) (linear normalisers ``z``
    positive); growing caches hold ``context`` entries.  Here (not in supernet) so that a board, which
    has no torch, builds the very inputs the host does.
    """
    rng = np.random.default_rng(seed)
    feed = {}
    for name, spec in layout.items():
        shape = [{"batch": batch_size, "past": context}.get(d, d) if isinstance(d, str) else d for d in spec["shape"]]
        if name == "token":
            feed[name] = rng.integers(0, spec.get("vocab_size", 2), size=shape, dtype=np.int64)
        elif name == "position":
            feed[name] = np.full(shape, context, dtype=np.int64)
        else:
            r = rng.standard_normal(shape, dtype=np.float32)
            feed[name] = (np.abs(r) + 1.0 if name.endswith(".z") else r).astype(spec["dtype"])
    return feed


def prefill_tokens(vocab_size: int, batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
    """The ``tokens`` input of a prefill timing: seeded, the same for every model, on host and board alike."""
    return {"tokens": np.random.default_rng(0).integers(0, vocab_size, (batch_size, seq_len), dtype=np.int64)}


def ort_runner(session, feed: dict, clock: str) -> Runner:
    """``runner(n) -> seconds`` of ``n`` back-to-back ``session.run`` calls on ``feed``.

    ``cpu``: with one intra-op thread ONNX Runtime computes on this thread; the outputs are host
    arrays, so each call is synchronised.
    """
    now = CLOCKS[clock]

    def run(n: int) -> float:
        start = now()
        for _ in range(n):
            session.run(None, feed)
        return now() - start

    return run


def ort_session(graph: str, tensors: list[dict], *, threads: int | None = None, provider: str = "cpu", seed: int = 0):
    """An ONNX Runtime session (all graph optimizations) of a weight-stripped ``graph``, random weights.

    The graph is copied into a temporary folder beside its freshly drawn weights (its external
    data ``<stem>.weights``), opened, and the folder removed.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
    tmp = tempfile.mkdtemp(prefix="nas-onnx-")
    try:
        local = os.path.join(tmp, os.path.basename(graph))
        shutil.copyfile(graph, local)
        materialize_weights(os.path.join(tmp, os.path.splitext(os.path.basename(graph))[0] + ".weights"), tensors, seed)
        return ort.InferenceSession(local, options, providers=providers)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

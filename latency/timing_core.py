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
import errno
import io
import json
import math
import os
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from functools import partial
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

# The graphs' input names (``supernet.onnx_export``, ``supernet.onnx_decode``), written out: a board runs this file alone
INPUT_IDS, POSITION, PIXEL_VALUES = "input_ids", "position", "pixel_values"
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
    journal: "Journal | None" = None,
) -> tuple[dict[str, Result], float]:
    """Time every runner by the protocol above; return ``({key: Result}, baseline_ms)``.

    ``baseline_ms`` anchors the drift correction; pass the one an earlier call returned so
    that chunks of one campaign (and a resumed campaign) share it.  ``journal`` (a :class:`Journal`)
    receives the calibration, the baseline and every visit as it finishes; what it already holds (a
    killed run's) is replayed, not timed again, so the resumed run concludes as if never stopped.
    """
    cores = cores or os.cpu_count() or 1
    keys = list(runners)

    def remembered(name: str, compute: Callable[[], object]):
        if journal is None:
            return compute()
        value = journal.get(name)
        if value is None:
            value = compute()
            journal.put(name, value)
        return value

    ref_calls = remembered("ref_calls", lambda: calibrate(reference, settings))

    def ref_ms() -> float:
        return float(np.median([_per_call_ms(reference, ref_calls) for _ in range(settings.ref_samples)]))

    if baseline_ms is None:
        baseline_ms = remembered("baseline_ms", lambda: float(np.median([ref_ms() for _ in range(5)])))
    calls = {k: remembered(f"calls {k}", lambda k=k: calibrate(runners[k], settings)) for k in keys}
    total = len(keys) * settings.rounds
    done = 0
    made = dict.fromkeys(keys, 0)  # visits of each key so far (retries included): a visit's name in the journal

    def visit(key: str, rnd: int) -> Visit:
        nonlocal done
        made[key] += 1
        v = Visit(**remembered(f"visit {key} {made[key]}", lambda: asdict(time_visit(key, rnd))))
        done += 1
        if progress is not None:
            progress(done, total, key)
        return v

    def time_visit(key: str, rnd: int) -> Visit:
        ref = ref_ms()
        runners[key](1)  # untimed: the first call after another model ran meets cold caches
        if settings.paired:  # ref, s1, r1, s2, r2, ...: each sample between two reference samples
            samples, refs = [], [ref]
            for _ in range(settings.per_round):
                samples.append(_per_call_ms(runners[key], calls[key]))
                refs.append(_per_call_ms(reference, ref_calls))
            pairs = [math.sqrt(a * b) for a, b in zip(refs, refs[1:])]
            return Visit(rnd, samples, ref, load(), refs[-1], pairs)
        samples = [_per_call_ms(runners[key], calls[key]) for _ in range(settings.per_round)]
        return Visit(rnd, samples, ref, load(), _per_call_ms(reference, ref_calls))

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
    """Append ``rows`` to the CSV at ``path`` (writing the header first if the file is new) atomically, then fsync.

    The rows are formatted first and written by one append; if the write fails part-way (a full disk),
    the file is cut back to its size before, so a table never holds half a row (a kill -9 cannot tear
    one ``write``; a power cut can, and :func:`read_lines` drops a torn last line on resume).  Keys not
    in ``columns`` are left out (a table written before a column existed keeps its header)."""
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    if new:
        writer.writeheader()
    for row in rows:
        writer.writerow(row)
    append_bytes(path, buf.getvalue().encode("utf-8"))


def append_bytes(path: str, data: bytes) -> None:
    """Append ``data`` to ``path`` whole or not at all (cut back to the old size on a failed write), then fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # less the umask, as open() does
    try:
        before = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException as e:
            os.ftruncate(fd, before)
            if isinstance(e, OSError) and not e.filename:
                e.filename = path  # name the file in the one-line error
            raise
    finally:
        os.close(fd)


def read_lines(path: str) -> tuple[list[str], str | None]:
    """The complete lines of a text file and its torn tail (the bytes after the last newline, or None):
    an append that a crash cut short leaves a last line without its newline."""
    with open(path, "rb") as f:
        data = f.read()
    cut = data.rfind(b"\n") + 1
    tail = data[cut:].decode("utf-8", "replace") if cut < len(data) else None
    return data[:cut].decode("utf-8").split("\n")[:-1], tail


class Journal:
    """What a measurement has done so far, one JSON line per entry, each appended whole and fsynced, so a
    run killed part-way (kill -9, Ctrl-C, a full disk) resumes without redoing it.

    The first line is the ``tag`` (what is being measured: pass, chunk, keys, seed); a journal of another
    tag is started afresh.  :func:`run_protocol` stores the calibration, the baseline and every visit as
    it finishes and, resumed, replays them instead of timing again."""

    def __init__(self, path: str, tag: dict):
        self.path, self.entries = path, {}
        header = json.dumps({"tag": tag}, sort_keys=True)
        lines, self.torn = read_lines(path) if os.path.exists(path) else ([], None)
        if lines and lines[0] == header:
            for line in lines[1:]:
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:  # damaged past here (not by our appends): what came before is kept
                    break
                self.entries[entry["k"]] = entry["v"]
        else:
            if os.path.exists(path):
                os.remove(path)
            append_bytes(path, (header + "\n").encode("utf-8"))

    def get(self, name: str):
        return self.entries.get(name)

    def put(self, name: str, value) -> None:
        append_bytes(self.path, (json.dumps({"k": name, "v": value}) + "\n").encode("utf-8"))
        self.entries[name] = value

    def remove(self) -> None:
        if os.path.exists(self.path):
            os.remove(self.path)


def sidecar_path(csv_path: str) -> str:
    return csv_path + ".json"


def write_json(path: str, data: dict) -> None:
    """Write ``data`` to ``path`` whole or not at all (:func:`write_atomic`)."""
    write_atomic(path, lambda f: f.write((json.dumps(data, indent=2, sort_keys=True) + "\n").encode()))


def _umask() -> int:
    """The process's umask, read from /proc where there is one (setting it to read it races other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str, write) -> None:
    """``write(f)`` into a new temporary file beside ``path`` (a unique name, created with ``O_EXCL``: a file or link
    planted there is never opened), fsync, rename over ``path``; the temporary file goes on any failure (Ctrl-C, a
    full disk).  (This module runs on the board too, without the rest of the package: hence not supernet.files.)"""
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # what open() would give it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError) and not e.filename:
            e.filename = path  # name the file in the one-line error
        raise


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

    The token (``input_ids``, one per sequence) is random, the ``position`` is ``context``, states are N(0, 1)
    (normalisers positive); growing caches (``past_key_values.*``) hold ``context`` entries (a model with a memory:
    at most ``window - 1``, the most a step of a segment reads).  Here (not in supernet) so that a board, which has no
    torch, builds the very inputs the host does.
    """
    rng = np.random.default_rng(seed)
    feed = {}
    position = layout.get(POSITION, {})  # (the cached decoder has none, and no memory)
    memory, window = position.get("memory", 0), position.get("window", 0)
    past = min(context, window - 1) if memory else context  # a memory bounds the cache a step reads (supernet.memory)
    for name, spec in layout.items():
        shape = [{"batch": batch_size, "past": past, "sequence": 1}.get(d, d) if isinstance(d, str) else d
                 for d in spec["shape"]]  # fmt: skip
        if name == INPUT_IDS:
            feed[name] = rng.integers(0, spec.get("vocab_size", 2), size=shape, dtype=np.int64)
        elif name == POSITION:
            feed[name] = np.full(shape, context, dtype=np.int64)
        else:
            r = rng.standard_normal(shape, dtype=np.float32)
            feed[name] = (np.abs(r) + 1.0 if spec.get("positive", name.endswith(".z")) else r).astype(spec["dtype"])
    return feed


def prefill_tokens(vocab_size: int, batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
    """The ``input_ids`` of a prefill timing: seeded, the same for every model, on host and board alike."""
    return {INPUT_IDS: np.random.default_rng(0).integers(0, vocab_size, (batch_size, seq_len), dtype=np.int64)}


def image_feed(batch_size: int, shape, seed: int = 0) -> dict[str, np.ndarray]:
    """The ``pixel_values`` of an image timing: ``batch_size`` seeded images of ``shape`` (C, H, W), float32 in [0, 1],
    the same for every model, on host and board alike."""
    return {PIXEL_VALUES: np.random.default_rng(seed).random((batch_size, *shape), dtype=np.float32)}


def past_of(present: str) -> str:
    """The step graph's input that takes back its output ``present`` (``present.0.key`` -> ``past_key_values.0.key``,
    ``present.0.s`` -> ``past.0.s``): :func:`supernet.onnx_decode.past_of`, written again for the board."""
    rest = present.split(".", 1)[1]
    return ("past_key_values." if rest.endswith((".key", ".value")) else "past.") + rest


def ort_runner(session, feed: dict, clock: str) -> Runner:
    """``runner(n) -> seconds`` of ``n`` back-to-back ``session.run`` calls on ``feed``.

    ``cpu``: with one intra-op thread ONNX Runtime computes on this thread; the outputs are host
    arrays, so each call is synchronised.
    """
    return call_runner(partial(session.run, None, feed), clock)


def call_runner(call: Callable[[], object], clock: str) -> Runner:
    """``runner(n) -> seconds`` of ``n`` back-to-back ``call()``s, read on ``clock`` (every host runner's loop: ONNX
    Runtime's here, torch's in :func:`latency.devices.cpu.torch_runner`)."""
    now = CLOCKS[clock]

    def run(n: int) -> float:
        start = now()
        for _ in range(n):
            call()
        return now() - start

    return run


def ort_session(graph: str, tensors: list[dict], *, threads: int | None = None, provider: str = "cpu", seed: int = 0,
                transform=None, register=None):
    """An ONNX Runtime session (all graph optimizations) of a weight-stripped ``graph``, random weights.

    The graph is copied into a temporary folder beside its freshly drawn weights (its external
    data ``<stem>.weights``), opened, and the folder removed.  ``transform(path, folder) -> path``
    rewrites the graph with its weights before it is opened (an INT8 precision: :mod:`latency.quantize`).
    ``register(options, path)`` prepares the session options for the graph (the host's onnxruntime device passes
    ``supernet.attention.ort_ops.register_if_used``: a graph exported with --custom-ops gets their library); this
    file imports nothing of the project, for it is also the bundle's runner on a board with numpy and onnxruntime only.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
    need = sum(int(t["nbytes"]) for t in tensors)
    sweep_temp_dirs()
    tmp = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")
    try:
        free = shutil.disk_usage(tmp).free
        if need + (64 << 20) > free:  # checked before writing: a huge model is refused, not written until the disk fills
            raise OSError(errno.ENOSPC, f"the random weights of this model need {need / 2**20:,.0f} MB, "
                          f"{free / 2**20:,.0f} MB are free (set TMPDIR to a larger disk, or time smaller subnets)", tmp)
        local = os.path.join(tmp, os.path.basename(graph))
        shutil.copyfile(graph, local)
        materialize_weights(os.path.join(tmp, os.path.splitext(os.path.basename(graph))[0] + ".weights"), tensors, seed)
        if transform is not None:
            local = transform(local, tmp)
        if register is not None:
            register(options, local)
        return ort.InferenceSession(local, options, providers=providers)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


TEMP_PREFIX = "nas-onnx-"  # + the pid of the process that owns the folder


def sweep_temp_dirs() -> None:
    """Remove the weight folders of :func:`ort_session` left behind by processes that are gone (a kill -9 skips
    the ``finally`` that removes them); folders of live processes are left alone."""
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        pid = name[len(TEMP_PREFIX):].split("-", 1)[0]
        if name.startswith(TEMP_PREFIX) and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def translate_start(layout: dict, batch: int) -> dict:
    """The decoder step's first inputs at ``batch`` rows (a step graph's input layout, ``tasks.translation.onnx``):
    empty caches, zero states, the start token (BOS) at position 0; the encoder's keys, values and masks still to add."""
    feed = {}
    for name, spec in layout.items():
        if name.startswith(("past.", "past_key_values.")) and ".encoder." not in name:
            shape = [{"batch": batch, "past": 0}.get(d, d) if isinstance(d, str) else d for d in spec["shape"]]
            feed[name] = np.zeros(shape, dtype=spec["dtype"])
    feed[INPUT_IDS] = np.full((batch, 1), layout[INPUT_IDS].get("start", 0), dtype=np.int64)
    feed[POSITION] = np.zeros(1, dtype=np.int64)
    return feed


def encoder_feed(names: list[str], outputs: list, rows: int) -> dict:
    """The encoder graph's outputs as the decoder step's inputs, repeated to ``rows``: ``present.{i}.encoder.key`` ->
    ``past_key_values.{i}.encoder.key`` (optimum's names), ``encoder_attention_mask.{i}`` as it is."""
    return {(past_of(n) if n.startswith("present.") else n): (np.repeat(a, rows, axis=0) if a.shape[0] != rows else a)
            for n, a in zip(names, outputs)}  # fmt: skip


def translate_ort_runner(encoder, step, layout: dict, source: int, steps: int, beam: int, clock: str, seed: int = 0) -> Runner:
    """``runner(n) -> seconds`` of ``n`` runs of HAT's translate workload on the two graphs of an encoder-decoder:
    the encoder over one seeded source of ``source`` bytes (its cross keys / values repeated to ``beam`` rows), then
    ``steps`` decoder steps at batch ``beam`` from empty caches, each feeding every row's most likely next id and the
    states it returned, gathered by hypothesis as beam search does (the caches grow step by step)."""
    src = np.random.default_rng(seed).integers(0, 256, (1, source), dtype=np.int64)  # (1, S)
    cross_names = [o.name for o in encoder.get_outputs()]
    outputs = [o.name for o in step.get_outputs()]
    states = [(j, past_of(name)) for j, name in enumerate(outputs) if j]
    start, order = translate_start(layout, beam), np.arange(beam)

    def once() -> None:
        feed = dict(start)
        feed.update(encoder_feed(cross_names, encoder.run(cross_names, {INPUT_IDS: src}), beam))
        for t in range(steps):
            feed[POSITION] = np.array([t], dtype=np.int64)
            outs = step.run(outputs, feed)
            feed[INPUT_IDS] = outs[0][:, -1].argmax(-1)[:, None].astype(np.int64)  # (B, 1)
            for j, name in states:
                feed[name] = outs[j][order]

    return call_runner(once, clock)

import math

import numpy as np
import pytest

from latency.timing_core import FLAG_INTERFERENCE, FLAG_LOAD, Settings, run_protocol

from tests.latency.latency_fakes import FakeClock

COSTS = {"a": 0.001, "b": 0.004, "c": 0.010, "d": 0.025}  # seconds per call
FAST = dict(warmup=2, repeats=6, rounds=3, min_sample_ms=20.0, ref_samples=2)


def run(clock, settings, **kw):
    runners = {k: clock.runner(k, c) for k, c in COSTS.items()}
    return run_protocol(runners, clock.runner("ref", 0.005), settings, np.random.default_rng(0), load=lambda: 0.0, cores=2, **kw)


def test_quiet_machine_gives_exact_times_and_batches_short_calls():
    results, baseline = run(FakeClock(), Settings(**FAST))
    assert baseline == pytest.approx(5.0)
    for k, c in COSTS.items():
        r = results[k]
        assert r.median_ms == pytest.approx(c * 1000) and r.iqr_ms == pytest.approx(0, abs=1e-9)
        assert r.repeats == 6 and r.rounds == 3 and r.flags == []
        assert r.calls * c * 1000 >= 20.0 > (r.calls - 1) * c * 1000  # one sample lasts >= min_sample_ms
    assert results["a"].calls == 20 and results["d"].calls == 1


def test_rounds_visit_every_model_once_in_shuffled_orders():
    visits = []
    results, _ = run(FakeClock(), Settings(**FAST), progress=lambda done, total, key: visits.append((done, total, key)))
    assert [d for d, _, _ in visits] == list(range(1, 13)) and all(t == 12 for _, t, _ in visits)
    rounds = [[k for _, _, k in visits[i : i + len(COSTS)]] for i in range(0, 12, len(COSTS))]
    assert all(sorted(r) == sorted(COSTS) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # the order is reshuffled every round


def test_interference_is_detected_and_the_disturbed_visits_remeasured():
    quiet_clock = FakeClock()
    run(quiet_clock, Settings(**FAST))
    middle = quiet_clock.now / 2
    # A 3x slowdown for a while in the middle of the rounds; drift correction off so only re-measuring can fix it.
    clock = FakeClock(slow=[(middle, middle + 0.4, 3.0)])
    results, _ = run(clock, Settings(**FAST, correct_drift=False))
    for k, c in COSTS.items():
        assert results[k].median_ms == pytest.approx(c * 1000), k  # every disturbed visit was redone on a quiet machine
        assert max(results[k].round_ms) == pytest.approx(c * 1000) and FLAG_INTERFERENCE not in results[k].flags
    assert len(clock.log) > len(quiet_clock.log)  # the re-measured visits cost extra runs

    # Without retries the same window leaves inflated rounds behind, and says so.
    clock = FakeClock(slow=[(middle, middle + 0.4, 3.0)])
    results, _ = run(clock, Settings(**FAST, correct_drift=False, max_retries=0))
    hit = [k for k in COSTS if FLAG_INTERFERENCE in results[k].flags]
    inflated = {k for k in COSTS if max(results[k].round_ms) > COSTS[k] * 1000 * 1.01}
    assert inflated and inflated <= set(hit)  # no inflated round goes unflagged


def test_drift_correction_rescales_by_the_reference_beside_each_visit():
    quiet = FakeClock()
    run(quiet, Settings(**FAST))
    # The whole second half is 10% slower: not a disturbance (within tolerance) but a drift.
    clock = FakeClock(slow=[(quiet.now / 2, 1e9, 1.1)])
    raw, _ = run(clock, Settings(**FAST, correct_drift=False, combine="median"))
    clock = FakeClock(slow=[(quiet.now / 2, 1e9, 1.1)])
    fixed, _ = run(clock, Settings(**FAST))
    assert any(raw[k].median_ms > COSTS[k] * 1000 * 1.05 for k in COSTS)
    for k, c in COSTS.items():
        assert fixed[k].median_ms == pytest.approx(c * 1000, rel=1e-9)
        assert fixed[k].raw_median_ms == pytest.approx(raw[k].median_ms, rel=0.02)


def test_a_machine_slow_to_the_end_is_drift_and_an_unsteady_one_is_flagged():
    clock = FakeClock()
    run(clock, Settings(**FAST))
    # 2x slower from 80% of the run on, to the end: drift; the reference corrects it, nothing is redone.
    slow = FakeClock(slow=[(clock.now * 0.8, 1e9, 2.0)])
    runners = {k: slow.runner(k, c) for k, c in COSTS.items()}
    results, _ = run_protocol(
        runners, slow.runner("ref", 0.005), Settings(**FAST), np.random.default_rng(0), load=lambda: 3.5, cores=2
    )
    for k, c in COSTS.items():
        assert results[k].median_ms == pytest.approx(c * 1000, rel=0.02) and FLAG_INTERFERENCE not in results[k].flags
        assert FLAG_LOAD in results[k].flags  # the load average exceeded the cores
    # A machine that keeps changing speed under every visit: retried, then flagged.
    unsteady = FakeClock(slow=[(t, t + 0.013, 2.0) for t in np.arange(0.0, 60.0, 0.029)])
    runners = {k: unsteady.runner(k, c) for k, c in COSTS.items()}
    results, _ = run_protocol(
        runners, unsteady.runner("ref", 0.005), Settings(**FAST), np.random.default_rng(0), load=lambda: 0.0, cores=2
    )
    assert any(FLAG_INTERFERENCE in r.flags for r in results.values())


def test_paired_reference_cancels_speed_swings_faster_than_a_visit():
    """A shared host whose speed swings +-30% with a 0.3 s period: a visit (4 samples, ~0.2 s) sees several
    speeds, so one reference per visit cannot correct it; a reference sample beside every sample can."""
    swing = lambda t: 1.0 + 0.3 * math.sin(2 * math.pi * t / 0.3)  # noqa: E731
    err = lambda res: max(abs(res[k].median_ms / (c * 1000) - 1) for k, c in COSTS.items())  # noqa: E731
    settings = dict(FAST, repeats=12, max_retries=0)
    per_visit, _ = run(FakeClock(speed=swing), Settings(**settings), baseline_ms=5.0)  # the reference's true time
    clock = FakeClock(speed=swing)
    paired, _ = run(clock, Settings(**settings, paired=True), baseline_ms=5.0)
    assert err(paired) < 0.04 and err(per_visit) > 0.1
    assert clock.log.count("ref") > len(COSTS) * 12  # a reference sample after every sample
    quiet, _ = run(FakeClock(), Settings(**FAST, paired=True))
    assert all(quiet[k].median_ms == pytest.approx(c * 1000) and quiet[k].flags == [] for k, c in COSTS.items())
    with pytest.raises(ValueError, match="paired needs drift correction"):
        Settings(paired=True, correct_drift=False)
    assert Settings.from_dict({"rounds": 3}).paired is False  # a table written before pairing existed was not paired


def test_min_of_round_medians_and_settings_validation():
    clock = FakeClock()
    results, _ = run(clock, Settings(**FAST, combine="min"))
    assert results["b"].median_ms == pytest.approx(4.0)
    with pytest.raises(ValueError, match="combine"):
        Settings(combine="mean")
    with pytest.raises(ValueError, match="repeats"):
        Settings(repeats=0)
    assert Settings.from_dict(Settings(rounds=7).to_dict()) == Settings(rounds=7)


def test_device_registry_options_and_clock_rules(tiny):
    import torch

    from latency.device import available, get_device
    from latency.protocol import measure
    from search_spaces import UserError
    from supernet import SuperTransformer

    assert {"cpu", "cuda", "onnxruntime"} <= set(available()) and "arm" not in available()
    with pytest.raises(UserError, match=r"--device: 'tpu' is not a device \(available: cpu, cuda, onnxruntime, arm --bundle FILE, ssh://user@host\)"):
        get_device("tpu")
    with pytest.raises(UserError, match=r"--device cpu: does not take --runtime \(it takes --threads, --clock\)"):
        get_device("cpu", runtime="eager")
    with pytest.raises(UserError, match="--clock cpu needs --threads 1"):
        get_device("cpu", threads=2, clock="cpu")
    before = torch.get_num_threads()
    try:
        device = get_device("cpu", threads=1, clock="cpu")
        assert device.fingerprint()["clock"] == "cpu" and device.fingerprint()["threads"] == 1
        model = SuperTransformer(tiny, generator=torch.Generator().manual_seed(0)).eval()
        models = {s.key: model.extract(s) for s in (tiny.smallest(), tiny.largest())}
        m = measure(device, models, tiny.workload(), Settings(**FAST))
        small, big = m.results[tiny.smallest().key], m.results[tiny.largest().key]
        assert 0 < small.median_ms < big.median_ms and m.baseline_ms > 0 and small.repeats == 6
    finally:
        torch.set_num_threads(before)


def test_cuda_runtimes_check_their_output_against_eager():
    """compile and cudagraph are checked against an eager call before anything is timed (no GPU needed for the check)."""
    import torch

    from latency.devices.cuda import CUDA
    from search_spaces import UserError

    dev = object.__new__(CUDA)  # the constructor wants a GPU; the check does not
    dev.runtime = "cudagraph"
    dev._check(torch.ones(2, 3), lambda: torch.ones(2, 3) + 1e-4, "the model [softmax]")  # within 1e-2 of the scale
    dev._check((torch.ones(1, 1, 5), {"k": None}), lambda: (torch.ones(1, 1, 5), {"k": None}), "a decode step")
    with pytest.raises(UserError, match=r"^--runtime cudagraph: the model \[linear, softmax\] computes other numbers than "
                                        r"eager mode \(largest difference 1.00e\+00 of the output's scale\); time it with "
                                        r"--runtime eager$"):  # fmt: skip
        dev._check(torch.zeros(2, 3), lambda: torch.ones(2, 3), "the model [linear, softmax]")
    dev.runtime = "compile"
    with pytest.raises(UserError, match=r"^--runtime compile: .* \(largest difference nan"):
        dev._check(torch.full((2,), float("nan")), lambda: torch.ones(2), "the model [hydra]")


def test_a_compile_failure_is_one_line_naming_the_model(monkeypatch):
    """--runtime compile: Inductor failing on a model (torch 2.11's Triton codegen on hydra's running mean, an H200,
    2026-11-27) is one line naming the model's types and Inductor's first line, not a traceback ending the campaign."""
    import re

    import torch

    from latency.devices.cuda import CUDA
    from search_spaces import UserError

    def broken(call, **kwargs):
        def run():
            raise RuntimeError("\nInductorError: TypeError: list indices must be integers or slices, not NoneType\nmore")

        return run

    monkeypatch.setattr(torch, "compile", broken)
    dev = object.__new__(CUDA)
    dev.runtime = "compile"
    with pytest.raises(UserError, match=rf"^--runtime compile: torch {re.escape(torch.__version__)} could not compile the model "
                                        r"\[hydra, softmax\] \(InductorError: TypeError: list indices must be integers "
                                        r"or slices, not NoneType\); time it with --runtime eager or cudagraph"):  # fmt: skip
        dev._step(lambda: torch.ones(2), "the model [hydra, softmax]")


def test_a_cuda_graph_runner_keeps_alive_what_its_graph_reads():
    """The runner of --runtime cudagraph holds the model call (weights, input tokens) and the static output: once
    prepare returns, nothing else does, and a freed input's memory went to the next model (a GPU's replay then read
    weights as token ids)."""
    import gc
    import weakref

    import torch

    from latency.devices.cuda import _Replay

    class Graph:
        replays = 0

        def replay(self):
            Graph.replays += 1

    def prepare():
        tokens = torch.zeros(4, dtype=torch.long)
        out = torch.zeros(4)
        return _Replay(Graph(), lambda: tokens + 1, out), weakref.ref(tokens), weakref.ref(out)

    run, tokens, out = prepare()
    gc.collect()
    assert tokens() is not None and out() is not None
    run()
    assert Graph.replays == 1
    del run
    gc.collect()
    assert tokens() is None and out() is None


def test_compiled_runs_take_the_fast_paths_even_where_torch_calls_a_compile_an_export(monkeypatch):
    """torch 2.11 says ``torch.compiler.is_exporting()`` is True under torch.compile (an H200, 2026-11-27): the
    registry then sent compiled runs (latency's compile runtime, train-supernet --compile) down the export forms.
    Inside ``fast_paths()`` the types take their fast paths; a real export still gets the traceable forms."""
    import torch

    from supernet.attention import registry

    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)  # torch 2.11 under torch.compile
    assert registry.exporting()  # torch.export: the traceable forms
    with registry.fast_paths():
        assert not registry.exporting()
        with registry.fast_paths():
            assert not registry.exporting()
        assert not registry.exporting()
    assert registry.exporting()
    picked = []
    typ = registry.get("local:32")
    monkeypatch.setattr(type(typ), "forward_onnx", lambda self, *a: picked.append("export") or a[2])
    monkeypatch.setattr(type(typ), "forward", lambda self, *a: picked.append("fast") or a[2])
    q = torch.zeros(1, 1, 4, 8)
    registry.attend(q, q, q, registry.parse_attention("local:32"))
    with registry.fast_paths():
        registry.attend(q, q, q, registry.parse_attention("local:32"))
    assert picked == ["export", "fast"]

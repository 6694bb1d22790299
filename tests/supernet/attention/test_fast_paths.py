"""The CPU fast paths of issue 22 against their references: the in-place inference path (no gradient
recorded), lengths on and off the block and chunk sizes, gradients of the window engine and of the
chunk sums, the traced (ONNX) block-local form, and the benchmarks' target lines."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from search_spaces import parse_attention
from supernet.attention import REGISTRY, attend, attend_reference, native
from supernet.attention.blocks import window_bmm, window_grad
from supernet.attention.linear import _exclusive_cumsum

SPARSE_AND_LINEAR = [
    "local:16", "local:33", "local:64", "dilated:5:3", "strided:16", "fixed:16", "longformer:40:5", "bigbird:16:5:2",
    "linear", "relu-linear", "cosformer:200", "performer:16", "sima", "msla:3",
]  # fmt: skip
# around the block (16, 32) and chunk (64) sizes: one short of, on, one past; and several blocks
LENGTHS = [15, 32, 33, 64, 65, 130]


def qkv(t: int, seed: int, h: int = 3, d: int = 16, requires_grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, h, t, d, generator=g).requires_grad_(requires_grad) for _ in range(3)]


def weights(spec, h=3, d=16):
    g = torch.Generator().manual_seed(7)
    return {n: torch.randn(*s, generator=g) * 0.5 for n, s in REGISTRY[spec.kind].weights(spec, h, d).items()}


@pytest.fixture(autouse=True)
def engine_only():
    """These tests are about the block engine: the compiled window kernel
    (tests/supernet/attention/test_native_kernels.py) stays off."""
    with native.disabled():
        yield


@pytest.mark.parametrize("spec", SPARSE_AND_LINEAR)
def test_inference_path_equals_reference(spec):
    """Without a gradient the window engine softmaxes in place: the same numbers as the reference."""
    s = parse_attention(spec)
    w = weights(s)
    worst = 0.0
    for t in LENGTHS:
        q, k, v = qkv(t, seed=t)
        with torch.no_grad():
            fast, ref = attend(q, k, v, s, w), attend_reference(q, k, v, s, w)
        assert fast.shape == ref.shape == q.shape and torch.isfinite(fast).all()
        worst = max(worst, (fast - ref).abs().max().item())
    assert worst <= 1e-4, worst


CHUNKED = ["local:16", "local:33", "dilated:5:3", "strided:16", "fixed:16", "longformer:40:5", "bigbird:16:5:2"]


@pytest.mark.parametrize("spec", CHUNKED)
def test_head_chunks_share_buffers_and_write_in_place(spec, monkeypatch):
    """Long inputs run a few heads per call, reusing one score buffer and writing each chunk's answer
    straight into the output (batch 1) or copying it (batch 2, where a head slice is not contiguous):
    forced here to one head per call.  A second call must not overwrite the first call's answer."""
    from supernet.attention import sparse

    monkeypatch.setattr(sparse, "SCORE_BYTES", 1)
    s = parse_attention(spec)
    worst = 0.0
    for b, t in ((1, 64), (1, 65), (2, 33), (2, 130)):
        g = torch.Generator().manual_seed(b * 1000 + t)
        first, second = ([torch.randn(b, 3, t, 16, generator=g) for _ in range(3)] for _ in range(2))
        with torch.no_grad():
            out1 = attend(*first, s, {})
            out2 = attend(*second, s, {})
            worst = max(worst, (out1 - attend_reference(*first, s, {})).abs().max().item())
            worst = max(worst, (out2 - attend_reference(*second, s, {})).abs().max().item())
    assert worst <= 1e-4, worst


@pytest.mark.parametrize("spec", CHUNKED)
def test_head_chunks_of_a_fused_projection(spec, monkeypatch):
    """q, k, v as the model makes them, strided views of one (B, T, 3, H, D) projection, one head per call at a length
    on the block size: one head's rows are then a strided view, which the window views must not be given."""
    from supernet.attention import sparse

    monkeypatch.setattr(sparse, "SCORE_BYTES", 1)
    s = parse_attention(spec)
    for t in (64, 128):
        x = torch.randn(1, t, 3, 3, 16, generator=torch.Generator().manual_seed(t))
        q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
        with torch.no_grad():
            out = attend(q, k, v, s, {})
        assert (out - attend_reference(q, k, v, s, {})).abs().max().item() <= 1e-4


@pytest.mark.parametrize("spec", ["local:8", "local:40", "dilated:4:3", "longformer:8:3", "bigbird:8:3:2"])
def test_bidirectional_head_chunks_equal_the_reference(spec, monkeypatch):
    """The encoder forms run a few heads per call too (one here): each chunk's answer, global rows included."""
    from supernet.attention import sparse

    monkeypatch.setattr(sparse, "SCORE_BYTES", 1)
    s = parse_attention(spec)
    worst = 0.0
    for b, t in ((1, 64), (1, 65), (2, 33), (2, 130)):
        g = torch.Generator().manual_seed(b * 1000 + t)
        q, k, v = (torch.randn(b, 3, t, 16, generator=g) for _ in range(3))
        with torch.no_grad():
            out = attend(q, k, v, s, {}, causal=False)
        worst = max(worst, (out - attend_reference(q, k, v, s, {}, causal=False)).abs().max().item())
    assert worst <= 1e-4, worst


@pytest.mark.parametrize("spec", ["local:64", "longformer:33:4", "linear", "cosformer:200"])
def test_gradients_off_the_block_size(spec):
    """Gradients at lengths one short of and one past a block / chunk (the padded tail and the first blocks)."""
    s = parse_attention(spec)
    worst = 0.0
    for t in (31, 33, 63, 65, 97):
        q, k, v = qkv(t, seed=t, requires_grad=True)
        grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(t + 1))
        fast, ref = attend(q, k, v, s), attend_reference(q, k, v, s)
        g_fast, g_ref = torch.autograd.grad(fast, (q, k, v), grad_out), torch.autograd.grad(ref, (q, k, v), grad_out)
        worst = max(worst, (fast - ref).abs().max().item(), *((a - b).abs().max().item() for a, b in zip(g_fast, g_ref)))
    assert worst <= 1e-4, worst


@pytest.mark.parametrize("before,m", [(0, 5), (1, 5), (2, 5), (3, 2), (1, 1)])
def test_window_bmm_and_its_gradient(before, m):
    """window_bmm equals the products with explicitly padded windows, and window_grad is its adjoint
    (<window_grad(a, b), x> == <a, b @ windows(x)^T>), including fewer blocks than ``before``."""
    c, d = 4, 3
    g = torch.Generator().manual_seed(before * 10 + m)
    x = torch.randn(m * c, d, generator=g)
    padded = torch.cat((torch.zeros(before * c, d), x))
    span = (before + 1) * c
    wins = torch.stack([padded[w * c : w * c + span] for w in range(m)])  # (M, span, D)
    a = torch.randn(m, c, span, generator=g)
    assert torch.allclose(window_bmm(a, x, before, transpose=False), a @ wins, atol=1e-6)
    b = torch.randn(m, c, d, generator=g)
    assert torch.allclose(window_bmm(b, x, before, transpose=True, alpha=0.5), 0.5 * b @ wins.transpose(1, 2), atol=1e-6)
    lhs = (window_grad(a, b, before, alpha=0.5) * x).sum().item()
    assert math.isclose(lhs, 0.5 * (a * (b @ wins.transpose(1, 2))).sum().item(), rel_tol=1e-4, abs_tol=1e-5)


def test_exclusive_chunk_sums_and_their_gradient():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 4, 5, generator=g, requires_grad=True)
    ref = torch.cat((torch.zeros_like(x[:, :, :1]), torch.cumsum(x[:, :, :-1], dim=2)), dim=2)
    out = _exclusive_cumsum(x)
    assert torch.allclose(out, ref, atol=1e-6) and torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0]))
    gy = torch.randn(out.shape, generator=g)
    assert torch.allclose(torch.autograd.grad(out, x, gy)[0], torch.autograd.grad(ref, x, gy)[0], atol=1e-6)


@pytest.mark.parametrize("spec", ["local:1", "local:8", "local:64", "local:200", "dilated:1:5", "dilated:9:2",
                                  "longformer:8:3", "longformer:16:40", "strided:1", "strided:8", "strided:64",
                                  "fixed:1", "fixed:8", "fixed:64", "bigbird:4:2:2", "bigbird:8:3:3",
                                  "bigbird:16:40:1"])  # fmt: skip
def test_block_local_onnx_form_equals_reference(spec):
    """The traced (ONNX) form run eagerly: the reference's numbers at lengths on and off its blocks
    (the exported graphs themselves: tests/supernet/attention/test_attention_types.py::test_onnx_round_trip_of_every_type)."""
    s = parse_attention(spec)
    typ = REGISTRY[s.kind]
    for t in (1, 17, 32, 150):
        q, k, v = qkv(t, seed=t)
        assert (typ.forward_onnx(q, k, v, s, {}) - typ.reference(q, k, v, s, {})).abs().max().item() <= 1e-5, (spec, t)


@pytest.mark.parametrize("spec", ["local:1", "local:8", "local:40", "local:200", "dilated:1:5", "dilated:4:3",
                                  "dilated:9:2", "longformer:8:3", "longformer:16:40"])  # fmt: skip
def test_bidirectional_block_local_onnx_form_equals_reference(spec):
    """The symmetric window's traced form run eagerly: keys past the end hidden (also the padding of dilated's
    shorter residue streams), the global rows also when T < G."""
    s = parse_attention(spec)
    typ = REGISTRY[s.kind]
    for t in (1, 2, 17, 32, 150):
        q, k, v = qkv(t, seed=t)
        out, ref = typ.bidirectional_onnx(q, k, v, s, {}), typ.bidirectional_reference(q, k, v, s, {})
        assert out.shape == ref.shape and (out - ref).abs().max().item() <= 1e-5, (spec, t)


def _script(name: str):
    path = Path(__file__).resolve().parents[3] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_bench_attention_target_lines():
    """The rate check compares each type's GFLOP/s with SDPA's and its speed-up with its FLOP ratio."""
    bench = _script("bench_attention")

    def row(kind, ms):
        r = bench.Row("attention", "cpu", "fp32", kind, 4096, 1, 12, 64, "fwd", "ok", ms=ms)
        r.tflops = bench.attention_flops(parse_attention(kind), 1, 12, 4096, 64, False) / (ms * 1e-3) / 1e12
        return r

    rows = [row("softmax", 200.0), row("local:64", 12.0), row("linear", 60.0), row("hydra", 10.0)]  # 16.7x; 3.3x of 16x
    lines = bench.rate_check(rows)
    assert len(lines) == 3 and lines[2].endswith("[INFO: element-wise, no GEMM]")
    assert "local:64" in lines[0] and "[PASS" in lines[0] and "16.67x faster" in lines[0]
    assert "linear" in lines[1] and "[FAIL" in lines[1]
    speed = bench.speedup_check(rows)
    assert len(speed) == 1 and "16.67x" in speed[0] and "[PASS >= 15.0x]" in speed[0]
    assert bench.sdpa_share(rows, rows[1]) == pytest.approx(rows[1].tflops / rows[0].tflops)


def test_bench_attention_interleaves_the_types_and_skips_what_is_too_slow(monkeypatch):
    """The timed runs of one length go in rounds, one of every type per round (so that a drift of the host touches
    every type alike), or (--order cells) each type's back to back; a type whose warm-up runs past --max-seconds is
    skipped at that length and every longer one."""
    bench = _script("bench_attention")
    order: list[str] = []  # the type of each timed run
    current = [""]  # the type whose run ran last
    make = bench.attention_case

    def case(spec, *args):
        run = make(spec, *args)

        def tagged():
            current[0] = str(spec)
            run()

        return tagged

    monkeypatch.setattr(bench, "attention_case", case)
    monkeypatch.setattr(bench, "timed", lambda run, device: (run(), order.append(current[0]), 1.0)[2])
    args = bench.argparse.Namespace(types="softmax,local:8,linear", lengths="16,32", devices="cpu", modes="fwd",
                                    scopes="attention", dtype="fp32", batch=1, heads=2, head_dim=8, reps=3,
                                    max_seconds=60.0, form="causal", order="rounds")  # fmt: skip
    rows = bench.run_bench(args)
    assert [r.status for r in rows] == ["ok"] * 6 and all(r.reps == 3 for r in rows)
    assert order == ["softmax", "local:8", "linear"] * 6  # 3 rounds at T=16, then 3 at T=32
    order.clear()
    args.order = "cells"
    bench.run_bench(args)
    assert order == [kind for kind in ("softmax", "local:8", "linear") for _ in range(3)] * 2  # back to back
    args.order = "rounds"
    warmed: list[str] = []
    monkeypatch.setattr(bench, "warm_up", lambda run, device, limit: (run(), warmed.append(current[0]), None)[2])
    order.clear()
    rows = bench.run_bench(args)  # every warm-up "too slow": T=16 skipped, T=32 not even warmed up
    assert [r.status for r in rows] == ["skipped"] * 6 and warmed == ["softmax", "local:8", "linear"] and order == []


def test_bench_onnx_attention_runs_and_checks_parity(capsys):
    bench = _script("bench_onnx_attention")
    assert bench.main(["--types", "softmax,local:64,linear", "--length", "96", "--heads", "2", "--head-dim", "8",
                       "--rounds", "1"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.count("[PASS <= 0.0001]") == 3  # every exported graph matches the torch reference
    assert "load average" in out and "local:64" in out and ">= 20x]" in out  # issue 39: local:64 and linear 20x
    with pytest.raises(SystemExit) as e:
        bench.main(["--types", "local:64,softmax"])
    assert e.value.code == 2
    assert "the first type is the baseline and must be softmax, got local:64" in capsys.readouterr().err
    assert bench.main(["--form", "bidirectional", "--types", "softmax,local:8,longformer:8:3,xca", "--length", "40",
                       "--heads", "2", "--head-dim", "8", "--rounds", "1"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.count("[PASS <= 0.0001]") == 4 and "bidirectional form" in out and ">= 5x]" not in out
    with pytest.raises(SystemExit) as e:
        bench.main(["--form", "bidirectional", "--types", "softmax,strided:8"])
    assert e.value.code == 2 and "--types: strided:8 has no bidirectional form" in capsys.readouterr().err

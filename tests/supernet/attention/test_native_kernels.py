"""The compiled window-attention kernel (supernet/attention/native.py), for each instruction set this CPU runs (AVX-512
and AVX2 on an AVX-512 host; ``isa`` below): it builds on this machine, it
gives the reference's numbers and gradients for local:W, dilated:W:D and longformer:W:G (causal and bidirectional;
bigbird:W:G:R, fixed:S and strided:S causal;
lengths on and off its 16-query blocks; windows wider than the sequence; head sizes 16-128; strided
views of a fused projection), it is the path taken, and the block engine takes over wherever it does
not apply."""

import contextlib
import os
import shutil
import subprocess
import sys

import pytest
import torch

from search_spaces import parse_attention
from supernet.attention import attend, attend_reference, native

TYPES = [
    "local:1", "local:2", "local:16", "local:17", "local:64", "local:300", "dilated:1:4", "dilated:4:3", "dilated:16:2",
    "longformer:1:1", "longformer:16:5", "longformer:40:5", "longformer:8:40", "longformer:17:33",
]  # fmt: skip
BIGBIRD = ["bigbird:16:5:2", "bigbird:16:40:1", "bigbird:32:3:3", "bigbird:48:20:2", "bigbird:16:1:8"]  # W % 16 == 0
FIXED = ["fixed:16", "fixed:32", "fixed:48", "fixed:64"]  # S % 16 == 0
LENGTHS = [1, 2, 15, 16, 17, 33, 100, 257]


def projected(b: int, h: int, t: int, d: int, seed: int, scale: float = 1.0):
    """q, k, v as the model makes them: (B, H, T, D) views of one (B, T, 3, H, D) projection (not contiguous)."""
    x = torch.randn(b, t, 3, h, d, generator=torch.Generator().manual_seed(seed)) * scale
    return [x[:, :, i].transpose(1, 2) for i in range(3)]


@pytest.fixture(autouse=True, params=native.runnable_isas() or ("none",))
def isa(request):
    """Every test of the module runs with the kernels of each instruction set this CPU runs (the same source, simd.h's
    vectors); "none" where it runs none of them (the engine's tests still run)."""
    with native.using_isa(request.param) if request.param != "none" else contextlib.nullcontext():
        yield request.param


@pytest.fixture
def calls(monkeypatch):
    """Counts the kernel's forward calls."""
    count = {"n": 0}
    real = native._kernel

    class Counted:
        def window_forward(self, *args):
            count["n"] += 1
            return real().window_forward(*args)

        def window_backward(self, *args):
            return real().window_backward(*args)

    monkeypatch.setattr(native, "_kernel", Counted)
    return count


def test_the_kernel_builds_here(isa):
    """On a CPU that runs one of the kernels' instruction sets, with a C++ compiler (this project's machines and CI), the
    kernel of each such set is built and used, its build folder named by it; elsewhere status() names what is missing."""
    used, why = native.status()
    capable = isa != "none" and shutil.which(os.environ.get("CXX", "c++"))
    if capable and os.environ.get(native.ENV_OFF, "1") != "0":
        assert used and why == "", why
        assert native.isa() == isa
        assert f"{os.sep}{isa}-" in native._kernel().__file__
    else:
        assert not used and why


def test_the_instruction_set_follows_torch_and_the_override():
    """torch's capability picks the kernels' ISA (ATEN_CPU_CAPABILITY=avx2 lowers both, for a fair comparison); the
    NAS_KERNEL_ISA override takes one the CPU runs, and says why not otherwise."""
    runnable = native.runnable_isas()
    if "avx2" not in runnable:
        pytest.skip(f"this CPU ({native.machine()}) runs {runnable or 'none of the kernels instruction sets'}")
    code = (
        "import os\nfrom supernet.attention import native\nprint(native.choose_isa())\n"
        "for v in ('avx2', 'neon', 'sse4'):\n    os.environ[native.ENV_ISA] = v\n    print(native.choose_isa())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != native.ENV_ISA}
    got = subprocess.run([sys.executable, "-c", code], env={**env, "ATEN_CPU_CAPABILITY": "avx2"}, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert got[:2] == ["('avx2', '')", "('avx2', '')"]
    assert got[2] == f"(None, 'NAS_KERNEL_ISA=neon: this CPU ({native.machine()}) runs {', '.join(runnable)}')"
    assert got[3] == "(None, 'NAS_KERNEL_ISA=sse4: not one of avx512, avx2, neon')"


@pytest.mark.parametrize("spec", TYPES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_kernel_equals_reference(spec, causal, calls):
    if not native.status()[0]:
        pytest.skip(native.status()[1])
    s = parse_attention(spec)
    worst = 0.0
    for t in LENGTHS:
        q, k, v = projected(2, 3, t, 16, seed=t)
        with torch.no_grad():
            out = attend(q, k, v, s, causal=causal)
        ref = attend_reference(q, k, v, s, causal=causal)
        assert out.shape == ref.shape
        worst = max(worst, (out - ref).abs().max().item())
    assert worst <= 1e-5, worst
    assert calls["n"] == len(LENGTHS)  # the kernel ran, once per call (dilated: its streams in one call)


@pytest.mark.parametrize("spec", BIGBIRD + FIXED)
def test_segments_equal_reference(spec, calls):
    """bigbird's causal form: the window, the global keys and each block's picked blocks (gathered by the kernel
    as segments of their own); fixed:S: the window from the start of the query's block of S, and the summaries (the
    last key of every earlier block: a segment of keys S apart); forward and gradients; lengths up to 600 (blocks
    picking blocks far back, many summaries)."""
    if not native.status()[0]:
        pytest.skip(native.status()[1])
    s = parse_attention(spec)
    worst = 0.0
    for t in (1, 16, 33, 257, 600):
        g = torch.Generator().manual_seed(t)
        x = torch.randn(2, t, 2, 3, 32, generator=g, requires_grad=True)
        v = torch.randn(2, 3, t, 48, generator=g, requires_grad=True)
        grad_out = torch.randn(2, 3, t, 48, generator=g)
        q, k = (x[:, :, i].transpose(1, 2) for i in range(2))
        with torch.no_grad():
            worst = max(worst, (attend(q, k, v, s) - attend_reference(q, k, v, s)).abs().max().item())
        out, ref = attend(q, k, v, s), attend_reference(q, k, v, s)
        got, want = torch.autograd.grad(out, (x, v), grad_out), torch.autograd.grad(ref, (x, v), grad_out)
        worst = max(worst, (out - ref).abs().max().item(), *((a - b).abs().max().item() for a, b in zip(got, want)))
    assert worst <= 1e-4, worst
    assert calls["n"] == 10


@pytest.mark.parametrize("spec", ["strided:1", "strided:7", "strided:16", "strided:40", "strided:64"])
def test_strided_equals_reference_forward_and_gradients(spec, calls):
    """strided:S: the S-window, and causal attention within each residue stream (the column keys i - S, i - 2S, ...)
    joined into its softmax; lengths up to 600 (up to 599 columns at S = 1: ragged streams, blocks of 16 stream queries
    on and off).  With a gradient the kernel's backward runs twice with the joint log-sum-exp and rowsum(dO * O): the
    window, then each residue stream's keys strictly before the query (a stream's last key, seen by no query, gets 0)."""
    if not native.status()[0]:
        pytest.skip(native.status()[1])
    s = parse_attention(spec)
    worst = 0.0
    for t in (1, 15, 16, 17, 64, 100, 257, 600):
        q, k, v = projected(2, 3, t, 32, seed=t)
        with torch.no_grad():
            worst = max(worst, (attend(q, k, v, s) - attend_reference(q, k, v, s)).abs().max().item())
    assert worst <= 1e-5, worst
    assert calls["n"] == 8
    worst = 0.0
    for t in (1, 5, 17, 100, 257):
        x = torch.randn(1, t, 3, 2, 16, generator=torch.Generator().manual_seed(t), requires_grad=True)
        q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
        got = torch.autograd.grad(attend(q, k, v, s).square().sum(), x)[0]
        want = torch.autograd.grad(attend_reference(q.double(), k.double(), v.double(), s).square().sum(), x)[0]
        worst = max(worst, (got - want).abs().max().item() / max(1.0, want.abs().max().item()))
    assert worst <= 1e-5 and calls["n"] == 13, worst


@pytest.mark.parametrize(
    "spec", ["local:1", "local:17", "local:64", "dilated:4:3", "dilated:16:2", "longformer:16:5", "longformer:8:40"]
)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_kernel_gradients_equal_reference(spec, causal, calls):
    """The backward (P recomputed from the kept log-sum-exp, dK and dV accumulated block by block, each key row
    zeroed when first reached): q and k through one fused projection, v on its own (another head size)."""
    if not native.status()[0]:
        pytest.skip(native.status()[1])
    s = parse_attention(spec)
    worst = 0.0
    for t in (1, 15, 17, 64, 100, 257):
        g = torch.Generator().manual_seed(t)
        x = torch.randn(2, t, 2, 3, 32, generator=g, requires_grad=True)
        v = torch.randn(2, 3, t, 48, generator=g, requires_grad=True)
        grad_out = torch.randn(2, 3, t, 48, generator=g)
        q, k = (x[:, :, i].transpose(1, 2) for i in range(2))
        out, ref = attend(q, k, v, s, causal=causal), attend_reference(q, k, v, s, causal=causal)
        got, want = torch.autograd.grad(out, (x, v), grad_out), torch.autograd.grad(ref, (x, v), grad_out)
        worst = max(worst, (out - ref).abs().max().item(), *((a - b).abs().max().item() for a, b in zip(got, want)))
    assert worst <= 1e-4, worst
    assert calls["n"] >= 6


@pytest.mark.parametrize("d,dv", [(16, 16), (32, 32), (64, 48), (64, 64), (128, 128)])
def test_head_sizes_and_peaked_scores(d, dv, calls):
    """Every head size the kernel has a register layout for, keys strided (a fused projection) and back to back;
    scores large enough (x30) that each row's softmax is nearly one-hot (the exponential's range and the max
    subtraction)."""
    if not native.status()[0]:
        pytest.skip(native.status()[1])
    s = parse_attention("local:40")
    for t, scale, contiguous in ((70, 1.0, False), (70, 30.0, False), (70, 1.0, True)):
        q, k, _ = projected(1, 2, t, d, seed=d + t, scale=scale)
        if contiguous:  # rows back to back: the score tiles' stride known when compiling
            q, k = q.contiguous(), k.contiguous()
        v = torch.randn(1, 2, t, dv, generator=torch.Generator().manual_seed(dv))
        with torch.no_grad():
            out = attend(q, k, v, s)
        ref = attend_reference(q, k, v, s)
        assert (out - ref).abs().max().item() <= 1e-5, (d, dv, scale, contiguous)
    assert calls["n"] == 3


@pytest.mark.parametrize(
    "window",
    [native.Window(63, 0), native.Window(15, 0, columns=16), native.Window(20, 20, step=4), native.Window(31, 0, blocks=32)],
    ids=["local", "strided", "dilated", "fixed"],
)
def test_threads_split_the_blocks_without_changing_a_bit(window):
    if not native.status()[0]:
        pytest.skip(native.status()[1])
    q, k, v = projected(2, 4, 300, 64, seed=3)
    before = torch.get_num_threads()
    outs, grads = [], []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(native.window_attention(q, k, v, window))
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]  # the backward too
            grads.append(torch.autograd.grad(native.window_attention(*leaves, window).sum(), leaves))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.parametrize(
    "window", [native.Window(63, 0), native.Window(63, 0, step=4)], ids=["local", "dilated"]
)
def test_outputs_past_l2_stream_with_the_same_numbers(window):
    """An output of 2 MB or more is written with streaming stores where a block's rows are 64-byte aligned, with
    ordinary stores where they are not (a view 4 floats into a wider tensor): the same numbers either way, and
    the reference's, forward and (dq streamed; dilated's in place on its residue streams) gradients."""
    if not native.status()[0]:
        pytest.skip(native.status()[1])
    q, k, v = (x.contiguous() for x in projected(1, 4, 2048, 64, seed=5))  # out: 4 * 2048 * 64 floats = 2 MB
    spec = parse_attention("dilated:64:4" if window.step > 1 else "local:64")
    want = attend_reference(q, k, v, spec)
    with torch.no_grad():
        whole = native.window_attention(q, k, v, window)
        wide = torch.zeros(1, 4, 2048, 128)  # rows 512 bytes apart
        for at in (16, 4):  # 64-byte aligned, and not
            into = wide[..., at : at + 64]
            native.window_into(into, q, k, v, window)
            assert torch.equal(into, whole), at
    assert (whole - want).abs().max().item() <= 1e-5
    x = [t.clone().requires_grad_(True) for t in (q, k, v)]
    grad_out = torch.randn(whole.shape, generator=torch.Generator().manual_seed(6))
    got = torch.autograd.grad(native.window_attention(*x, window), x, grad_out)
    ref = torch.autograd.grad(attend_reference(*x, spec), x, grad_out)
    assert max((a - b).abs().max().item() for a, b in zip(got, ref)) <= 1e-4


def test_columns_and_steps_are_refused_where_they_do_not_hold():
    """The kernel's own checks: columns need a causal window shorter than the stride; a step of at least 1; a forward
    where a query does not see itself (after = -1, the backward's columns) is refused."""
    if not native.status()[0]:
        pytest.skip(native.status()[1])
    q, k, v = projected(1, 2, 40, 16, seed=0)
    with pytest.raises(RuntimeError, match="the window shorter than the stride"):
        native.window_attention(q, k, v, native.Window(16, 0, columns=16))
    with pytest.raises(RuntimeError, match="step \\(dilation\\) >= 1"):
        native.window_attention(q, k, v, native.Window(3, 0, step=0))
    with pytest.raises(RuntimeError, match="every query sees itself"):
        native.window_attention(q, k, v, native.Window(40, -1, step=4))


def test_the_engine_runs_where_the_kernel_does_not_apply(calls):
    """float64, a head size without a register layout, or native.disabled(): the block engine, same numbers
    (with a gradient too)."""
    s = parse_attention("local:16")
    q, k, v = projected(1, 2, 50, 16, seed=1)
    q64, k64, v64 = (x.double() for x in (q, k, v))
    q24, k24, v24 = projected(1, 2, 50, 24, seed=2)
    assert native.window_attention(q64, k64, v64, native.Window(15, 0)) is None
    assert native.window_attention(q24, k24, v24, native.Window(15, 0)) is None
    q24g = q24.detach().clone().requires_grad_(True)
    out = attend(q24g, k24, v24, s)
    out.sum().backward()
    assert q24g.grad is not None and torch.isfinite(q24g.grad).all()
    assert (out.detach() - attend_reference(q24, k24, v24, s)).abs().max().item() <= 1e-5
    ref = attend_reference(q, k, v, s)
    with torch.no_grad():
        assert (attend(q64, k64, v64, s) - attend_reference(q64, k64, v64, s)).abs().max().item() <= 1e-10
        assert (attend(q24, k24, v24, s) - attend_reference(q24, k24, v24, s)).abs().max().item() <= 1e-5
        with native.disabled():
            assert native.status() == (False, "turned off in this process (native.disabled())")
            assert (attend(q, k, v, s) - ref).abs().max().item() <= 1e-5
    assert calls["n"] == 0
    o = parse_attention("fixed:40")  # S not a multiple of the kernel's 16 queries: the engine
    with torch.no_grad():
        assert (attend(q, k, v, o) - attend_reference(q, k, v, o)).abs().max().item() <= 1e-5
    assert calls["n"] == 0


def test_the_environment_turns_it_off():
    env = dict(os.environ, **{native.ENV_OFF: "0"})
    code = "from supernet.attention import native; print(native.status())"
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "(False, 'NAS_NATIVE_KERNELS=0')"


def test_a_failed_build_leaves_the_engine_in_charge(tmp_path, monkeypatch):
    """A kernel that does not compile (an old compiler, a broken toolchain): one warning naming the failure,
    status() says why, and attention runs on the block engine with the same numbers."""
    broken = tmp_path / "window_attention.cpp"
    broken.write_text("this is not C++;\n")
    binding = tmp_path / "binding.cpp"  # broken too: ninja would finish compiling torch's headers for it first (~15 s)
    binding.write_text("this is not C++ either;\n")
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setattr(native, "SOURCE", broken)
    monkeypatch.setattr(native, "BINDING", binding)
    monkeypatch.setattr(native, "NAME", "nas_window_attention_broken")
    native._build.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="the compiled window-attention kernel is not used: the build failed"):
            used, why = native.status()
        assert not used and why.startswith("the build failed (")
        s = parse_attention("local:16")
        q, k, v = projected(1, 2, 40, 16, seed=4)
        with torch.no_grad():
            assert (attend(q, k, v, s) - attend_reference(q, k, v, s)).abs().max().item() <= 1e-5
    finally:
        native._build.cache_clear()  # the next test builds (loads) the real kernel again


def test_a_killed_build_leaves_no_lock_that_hangs_the_next(tmp_path):
    """torch's cpp_extension waits forever on its baton file ``lock``, which a build killed half-way leaves behind;
    under the OS lock of :func:`native.build_lock` (released however its holder ends) it can only be stale: removed."""
    from filelock import FileLock

    (tmp_path / "lock").write_text("")  # the baton of a build that was killed
    with native.build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()
        probe = ("import sys; from filelock import FileLock, Timeout\n"
                 "try:\n    FileLock(sys.argv[1], timeout=0).acquire()\nexcept Timeout:\n    sys.exit(3)")
        held = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "nas-build.lock")])
        assert held.returncode == 3  # another process's build waits for this one
    with FileLock(tmp_path / "nas-build.lock", timeout=0):  # released on leaving
        pass

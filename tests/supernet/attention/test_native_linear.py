"""The compiled kernels of the linear family (supernet/attention/native.py: ``linear_forward``, ``dwconv_forward``,
``hydra_forward``): at inference on the CPU linear, relu-linear, cosformer, performer, sima, msla and hydra (and the
convolutions of msla, lsra, convmod) give their references' numbers through them, for lengths on and off the
kernel's 16-token blocks, every value head size, strided views of a fused projection and peaked features; with a
gradient recorded the kernel takes the features the torch maps give and its backward (``linear_backward``) gives the
reference's gradients; the torch code runs where the features are not a multiple of 16, off float32."""

import contextlib

import pytest
import torch

from search_spaces import parse_attention
from supernet.attention import attend, attend_reference, native
from supernet.attention.registry import get
from tests.supernet.attention.test_native_kernels import projected

LINEAR = ["linear", "relu-linear", "cosformer:300", "performer:64", "performer:32", "sima", "msla:3", "msla:5"]
CONVS = ["lsra:4", "convmod:3"]
LENGTHS = [1, 2, 15, 16, 17, 33, 100, 257]

pytestmark = pytest.mark.skipif(not native.status()[0], reason=f"the compiled kernels are not used: {native.status()[1]}")


@pytest.fixture(autouse=True, params=native.runnable_isas() or ("none",))
def isa(request):
    """Every test runs with the kernels of each instruction set this CPU runs
    (tests/supernet/attention/test_native_kernels.py)."""
    with native.using_isa(request.param) if request.param != "none" else contextlib.nullcontext():
        yield request.param


def weights(spec, heads: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shapes = get(spec).weights(spec, heads, d, 512)
    return {name: torch.randn(*shape, generator=g) * 0.3 for name, shape in shapes.items()}


@pytest.fixture
def calls(monkeypatch):
    """Counts the compiled kernels' calls by name."""
    count: dict[str, int] = {}
    real = native._kernel

    class Counted:
        def __getattr__(self, name):
            def call(*args):
                count[name] = count.get(name, 0) + 1
                return getattr(real(), name)(*args)

            return call

    monkeypatch.setattr(native, "_kernel", Counted)
    return count


def relative(out, ref) -> float:
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def scaled(grad, ref) -> float:
    """A gradient's error relative to max(1, its scale): a gradient that cancels to near zero (one token: the output is
    v whatever the scores) is held to float32's rounding of the terms that cancel, not to its own tiny scale."""
    return ((grad - ref).abs().max() / ref.abs().max().clamp_min(1.0)).item()


FORMS = [(n, c) for n in LINEAR + CONVS for c in (True, False) if c or "bidirectional" in get(parse_attention(n)).forms]


@pytest.mark.parametrize("name,causal", FORMS, ids=[f"{n}-{'causal' if c else 'bidirectional'}" for n, c in FORMS])
def test_inference_equals_reference(name, causal, calls):
    spec = parse_attention(name)
    worst = 0.0
    for t in LENGTHS:
        q, k, v = projected(2, 4, t, 16, seed=t)
        k = k[:, : get(spec).heads(spec, 4)[0]]  # the type's key heads (lsra: the attending half)
        w = weights(spec, 4, 16, seed=t)
        with torch.no_grad():
            out = attend(q, k, v, spec, w, causal=causal)
        ref = attend_reference(q.double(), k.double(), v.double(), spec, {n: x.double() for n, x in w.items()}, causal=causal)
        worst = max(worst, relative(out.double(), ref))
    assert worst <= 1e-5, worst
    kind = name.split(":")[0]
    expected = {"linear_forward"} if causal and kind not in ("lsra", "convmod") else set()  # encoders: three GEMMs
    if kind in ("msla", "lsra", "convmod"):
        expected.add("dwconv_forward")
    assert expected <= set(calls), (expected, calls)  # the kernels ran
    if "linear_forward" in expected:
        assert calls["linear_forward"] == len(LENGTHS) * (2 if kind == "msla" else 1)


@pytest.mark.parametrize("d,dv", [(16, 16), (32, 48), (48, 128), (64, 64), (128, 32)])
def test_head_sizes_and_peaked_features(d, dv, calls):
    """Every value head size; features F = D from 16 to 128 (cosformer: 2D); large inputs (x8): sums over the
    prefix grow and performer's exponentials peak."""
    for name in ("linear", "relu-linear", "cosformer:300", "sima"):
        spec = parse_attention(name)
        g = torch.Generator().manual_seed(d + dv)
        q, k = (torch.randn(1, 2, 100, d, generator=g) * 8 for _ in range(2))
        v = torch.randn(1, 2, 100, dv, generator=g)
        with torch.no_grad():
            out = attend(q, k, v, spec)
        ref = attend_reference(q.double(), k.double(), v.double(), spec)
        assert relative(out.double(), ref) <= 1e-5, name
    assert calls["linear_forward"] == 4


def test_a_recorded_gradient_runs_the_kernels_backward_with_the_references_gradients(calls):
    """With a gradient recorded the torch feature maps record theirs and the kernel takes the features (its forward
    keeps the denominators, ``linear_backward`` gives dq, dk, dv): the reference's gradients, the types' own weights
    (msla's convolutions) included, for lengths on and off the 16-token blocks."""
    runs = 0
    for name in LINEAR:
        spec = parse_attention(name)
        for t in (1, 16, 40):
            q, k, v = (x.detach().requires_grad_() for x in projected(1, 2, t, 16, seed=t))
            w = {n: x.requires_grad_() for n, x in weights(spec, 2, 16).items()}
            inputs = (q, k, v, *w.values())
            out = attend(q, k, v, spec, w)
            grads = torch.autograd.grad(out.square().sum(), inputs)
            ref = attend_reference(*(x.double() for x in (q, k, v)), spec, {n: x.double() for n, x in w.items()})
            want = torch.autograd.grad(ref.square().sum(), inputs)
            assert relative(out.double(), ref) <= 1e-5, (name, t)
            assert max(scaled(a.double(), b) for a, b in zip(grads, want)) <= 1e-4, (name, t)
            runs += 1
    assert calls["linear_backward"] == calls["linear_forward"] >= runs  # msla: two attentions (one token: its second in torch)


@pytest.mark.parametrize("normalize", [True, False], ids=["normalised", "numerator"])
def test_the_kernels_backward_equals_float64_for_every_shape(normalize):
    """linear_backward against autograd through the written-out float64 computation: one token, lengths on and off the
    blocks, features 16 to 256 (80: a width the products take in two slices), value head sizes 16 to 128, features and
    values as strided views of a fused projection, large inputs (x4: denominators far apart)."""
    from supernet.attention.linear import LINEAR_EPS

    g = torch.Generator().manual_seed(7)
    for t, f, dv, scale in [(1, 16, 16, 1), (15, 32, 48, 1), (16, 48, 64, 4), (17, 80, 32, 1), (100, 64, 128, 1),
                            (257, 256, 64, 4)]:  # fmt: skip
        x = torch.rand(2, t, 3, 2, max(f, dv), generator=g) * scale  # non-negative features, as a feature map gives
        fq, fk, v = x[:, :, 0, :, :f].transpose(1, 2), x[:, :, 1, :, :f].transpose(1, 2), x[:, :, 2, :, :dv].transpose(1, 2)
        v = v - 0.5 * scale
        go = torch.randn(2, 2, t, dv, generator=g)
        leaves = [y.detach().double().requires_grad_() for y in (fq, fk, v)]
        a = (leaves[0] @ leaves[1].transpose(-2, -1)).tril()  # (B, H, T, T)
        ref = a @ leaves[2] / (a.sum(-1, keepdim=True) + LINEAR_EPS) if normalize else a @ leaves[2]
        want = torch.autograd.grad(ref, leaves, go.double())
        inputs = [y.detach().requires_grad_() for y in (fq, fk, v)]
        out = native.causal_linear(*inputs, "none", normalize, LINEAR_EPS)
        grads = torch.autograd.grad(out, inputs, go)
        assert relative(out.double(), ref) <= 1e-5, (t, f, dv)
        assert max(scaled(a.double(), b) for a, b in zip(grads, want)) <= 1e-5, (t, f, dv)


def test_the_torch_code_runs_where_the_kernel_does_not_apply(calls):
    """Performer's 24 features (not a multiple of 16): the chunked GEMMs, the same numbers; turned off: the same."""
    spec = parse_attention("performer:24")
    q, k, v = projected(1, 2, 50, 16, seed=2)
    with torch.no_grad():
        out = attend(q, k, v, spec)
    assert relative(out, attend_reference(q, k, v, spec)) <= 1e-5 and not calls
    msla = parse_attention("msla:3")
    with native.disabled(), torch.no_grad():
        attend(q, k, v, msla, weights(msla, 2, 16))
    assert not calls


def test_bfloat16_inputs_run_in_float32_through_the_kernel(calls):
    """The linear family computes in float32 whatever its inputs: bfloat16 q, k, v are mapped and cast by torch,
    then the features run through the kernel (mapped already), the result cast back."""
    q, k, v = (x.bfloat16() for x in projected(1, 2, 50, 16, seed=2))
    spec = parse_attention("linear")
    with torch.no_grad():
        out = attend(q, k, v, spec)
    assert out.dtype == torch.bfloat16 and calls == {"linear_forward": 1}
    assert relative(out.double(), attend_reference(q.double(), k.double(), v.double(), spec)) <= 1e-2


def test_msla_adds_its_second_attention_into_the_first(calls):
    """msla's two linear attentions write one output: the second added by the kernel into the first's."""
    spec = parse_attention("msla:4")
    q, k, v = projected(1, 3, 70, 32, seed=3)
    w = weights(spec, 3, 32)
    with torch.no_grad():
        out = attend(q, k, v, spec, w)
    assert calls["linear_forward"] == 2 and calls["dwconv_forward"] == 3
    with native.disabled(), torch.no_grad():
        engine = attend(q, k, v, spec, w)
    assert relative(out, engine) <= 1e-5


def test_threads_split_the_heads_without_changing_a_bit():
    q, k, v = projected(2, 6, 300, 64, seed=4)
    before = torch.get_num_threads()
    try:
        outs, grads = [], []
        for n in (1, 2):
            torch.set_num_threads(n)
            with torch.no_grad():
                outs.append(attend(q, k, v, parse_attention("sima")))
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]  # the backward too
            grads.append(torch.autograd.grad(attend(*leaves, parse_attention("linear")).sum(), leaves))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_hydra_in_one_pass_equals_reference(causal, calls):
    """hydra's kernel: every length, head sizes 16-128, fused-projection views and contiguous heads, large inputs and
    an all-zero key row (its L2 normalisation divides by eps, as F.normalize does); with a gradient recorded the
    torch code runs, with the reference's gradients."""
    spec = parse_attention("hydra")
    worst, runs = 0.0, 0
    for d in (16, 48, 64, 128):
        for t in LENGTHS:
            q, k, v = projected(2, 3, t, d, seed=t + d, scale=8.0 if d == 48 else 1.0)
            if d == 64:
                q, k, v = (x.contiguous() for x in (q, k, v))
                k[:, :, t // 2] = 0.0
            with torch.no_grad():
                out = attend(q, k, v, spec, causal=causal)
            ref = attend_reference(q.double(), k.double(), v.double(), spec, causal=causal)
            worst, runs = max(worst, relative(out.double(), ref)), runs + 1
    assert worst <= 1e-5, worst
    assert calls == {"hydra_forward": runs}
    q, k, v = (x.detach().requires_grad_() for x in projected(1, 2, 40, 16, seed=1))
    out = attend(q, k, v, spec, causal=causal)
    ref = attend_reference(q, k, v, spec, causal=causal)
    got, want = (torch.autograd.grad(x.square().sum(), (q, k, v)) for x in (out, ref))
    assert relative(out, ref) <= 1e-5 and max(relative(a, b) for a, b in zip(got, want)) <= 1e-4
    assert calls == {"hydra_forward": runs}  # the gradient's forward: torch


def test_performer_features_are_computed_in_the_kernel(calls):
    """performer: each block's FAVOR+ features from the raw q, k rows inside the kernel (the projection as a tile
    product, the query's row-maximum shift, the key's |x|^2 / (2 sqrt(D))): head sizes 16-128 against 32-256 features,
    inputs up to x3; no feature tensor is handed over (q, k reach the kernel as they are)."""
    seen = []
    real = native.causal_linear

    def spy(q, k, v, feature="none", *args, **kwargs):
        seen.append((feature, q.shape[-1]))
        return real(q, k, v, feature, *args, **kwargs)

    worst = 0.0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(native, "causal_linear", spy)
        for m in (32, 64, 256):
            spec = parse_attention(f"performer:{m}")
            for d, dv, scale in ((16, 16, 1.0), (32, 48, 2.0), (64, 128, 3.0), (128, 32, 1.0)):
                g = torch.Generator().manual_seed(d + dv + m)
                q, k = (torch.randn(1, 2, 100, d, generator=g) * scale for _ in range(2))
                v = torch.randn(1, 2, 100, dv, generator=g)
                with torch.no_grad():
                    out = attend(q, k, v, spec)
                worst = max(worst, relative(out.double(), attend_reference(q.double(), k.double(), v.double(), spec)))
    assert worst <= 1e-5, worst
    assert calls == {"linear_forward": 12}
    assert {f for f, _ in seen} == {"performer"} and {d for _, d in seen} == {16, 32, 64, 128}

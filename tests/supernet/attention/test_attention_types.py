"""The attention types: every fast path equals its reference (forward and gradients), patterns are
the documented ones and causal, the CPU paths scale as O(T * W), models with every type extract,
count and export to ONNX exactly."""

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from search_spaces import LayerChoice, Subnet, parse_attention, parse_space
from search_spaces.attention import types
from supernet import SuperTransformer, Transformer, TransformerConfig, extract
from supernet.attention import REGISTRY, PatternType, attend, attend_reference, flex, kv_heads, native, patterns
from supernet.onnx_export import export_onnx, onnx_parity, op_counts

SPARSE = ("local", "dilated", "strided", "fixed", "longformer", "bigbird")
LINEAR = ("linear", "relu-linear", "cosformer", "performer")
# exported as block-local MatMul / Softmax, not a dense mask
BLOCK_LOCAL_ONNX = ("local", "dilated", "longformer", "strided", "fixed", "bigbird")

# Several parameterisations per type, chosen to hit the edges: window 1, window longer than the
# sequence, block sizes that do not divide the length, strides of 1, global tokens past the end.
SPECS = [
    "softmax", "gqa:1", "gqa:2", "gqa:4",
    "local:1", "local:8", "local:40", "local:200",
    "dilated:1:5", "dilated:4:3", "dilated:9:2",
    "strided:1", "strided:5", "strided:8",
    "fixed:1", "fixed:5", "fixed:8",
    "longformer:8:3", "longformer:16:40",
    "bigbird:5:1:3", "bigbird:8:3:2", "bigbird:16:20:1",
    "linear", "relu-linear", "cosformer:150", "performer:7", "performer:32",
    "hydra", "sima", "lsra:2", "lsra:5", "msla:2", "msla:7", "convmod:2", "convmod:9",
]  # fmt: skip
LENGTHS = [1, 17, 150]  # one token; fewer than most windows and blocks, not a multiple of them; many blocks


def qkv(spec, t, b=2, h=4, d=16, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    hk, hv = kv_heads(spec, h)
    q = torch.randn(b, h, t, d, generator=g)
    k = torch.randn(b, hk, t, d, generator=g) if hk else None
    v = torch.randn(b, hv, t, d, generator=g)
    return [x.requires_grad_(requires_grad) if x is not None else None for x in (q, k, v)]


def mix(spec, h=4, d=16, seed=5, requires_grad=False, max_seq_len=200):
    """The type's own weights (name -> tensor) for h heads of d, away from any special value."""
    g = torch.Generator().manual_seed(seed)
    shapes = REGISTRY[spec.kind].weights(spec, h, d, max_seq_len=max_seq_len)
    return {n: (torch.randn(*shape, generator=g) * 0.5).requires_grad_(requires_grad) for n, shape in shapes.items()}


def test_registry_covers_every_declared_type_with_all_paths():
    assert set(REGISTRY) == set(types()) and len(REGISTRY) >= 8  # every spelling the space layer accepts has a type
    for kind in SPARSE:
        t = REGISTRY[kind]
        assert isinstance(t, PatternType) and t.fused_onnx == (kind not in BLOCK_LOCAL_ONNX), kind
        assert t.path("cuda") == t.forward_cuda and t.path("cpu") == t.forward and t.path("cpu", exporting=True) == t.forward_onnx
        assert (
            type(t).forward_cuda is PatternType.forward_cuda and type(t).forward is not PatternType.forward
        )  # flex; own CPU path
    for spec in ("softmax", "gqa:2", "linear", "relu-linear", "cosformer:64", "performer:16"):
        s, t = parse_attention(spec), REGISTRY[parse_attention(spec).kind]
        q, k, v = qkv(s, 9)
        assert torch.equal(t.path("cuda")(q, k, v, s, {}), t.forward(q, k, v, s, {})), (
            spec
        )  # SDPA / chunked sums serve every device


@pytest.mark.parametrize("spec", SPECS)
def test_fast_path_equals_reference_forward_and_gradients(spec):
    s = parse_attention(spec)
    worst = 0.0
    for t in LENGTHS:
        q, k, v = qkv(s, t, seed=t, requires_grad=True)
        w = mix(s, requires_grad=True)
        fast, ref = attend(q, k, v, s, w), attend_reference(q, k, v, s, w)
        assert fast.shape == ref.shape == q.shape
        grad_out = torch.randn(fast.shape, generator=torch.Generator().manual_seed(99))
        inputs = [x for x in (q, k, v, *w.values()) if x is not None]
        g_fast = torch.autograd.grad(fast, inputs, grad_out)
        g_ref = torch.autograd.grad(ref, inputs, grad_out)
        worst = max(worst, (fast - ref).abs().max().item(), *((a - b).abs().max().item() for a, b in zip(g_fast, g_ref)))
    assert worst <= 1e-4, worst


@pytest.mark.parametrize("spec", SPECS)
def test_every_path_is_causal(spec):
    s = parse_attention(spec)
    q, k, v = qkv(s, 90, b=1, seed=3)
    t = 40
    k2, v2 = (k.clone() if k is not None else None), v.clone()
    if k2 is not None:
        k2[:, :, t:] += 3.0
    v2[:, :, t:] -= 2.0
    w = mix(s)
    for fn in (attend, attend_reference):
        a, b = fn(q, k, v, s, w), fn(q, k2, v2, s, w)
        assert torch.allclose(a[:, :, :t], b[:, :, :t], atol=1e-6, rtol=0), fn.__name__
        assert not torch.allclose(a[:, :, t:], b[:, :, t:])


def seen(spec: str, i: int, t: int = 64) -> set[int]:
    s = parse_attention(spec)
    return set(torch.nonzero(patterns.dense_mask(REGISTRY[s.kind].pattern, s, t)[i]).flatten().tolist())


def test_patterns_are_the_documented_ones():
    assert seen("local:3", 10) == {8, 9, 10}
    assert seen("local:64", 2) == {0, 1, 2}  # a window longer than the prefix sees the prefix
    assert seen("dilated:3:2", 10) == {6, 8, 10}
    assert seen("dilated:3:2", 3) == {1, 3}
    assert seen("strided:4", 13) == {10, 11, 12, 13, 9, 5, 1}
    assert seen("fixed:4", 13) == {12, 13, 3, 7, 11}
    assert seen("longformer:3:2", 10) == {0, 1, 8, 9, 10}
    assert seen("longformer:3:2", 1) == {0, 1}
    assert seen("softmax", 5) == {0, 1, 2, 3, 4, 5}


def test_bigbird_random_blocks_are_fixed_earlier_blocks():
    spec = parse_attention("bigbird:4:1:2")
    rows = {i: seen(str(spec), i, 128) - seen("longformer:4:1", i, 128) for i in range(128)}
    assert all(not rows[i] for i in range(8))  # blocks 0 and 1 have no block outside their window
    for i in range(8, 128):
        blocks = {j // 4 for j in rows[i]}
        assert 1 <= len(blocks) <= 2 and max(blocks) <= i // 4 - 2, (i, blocks)
        assert rows[i] | {0} >= {4 * b + r for b in blocks for r in range(4)} - {0}  # whole blocks
        assert rows[i] == rows[(i // 4) * 4]  # one choice per query block
    assert len({frozenset(r) for r in rows.values()}) > 5  # and it varies between blocks
    bigbird = REGISTRY["bigbird"].pattern
    again = patterns.dense_mask(bigbird, spec, 128)
    assert torch.equal(again, patterns.dense_mask(bigbird, spec, 128))
    assert torch.equal(patterns.dense_mask(bigbird, spec, 200)[:128, :128], again)  # length-independent


def test_performer_features_are_fixed_and_orthogonal():
    from supernet.attention.linear import performer_projection

    w = performer_projection(32, 16, torch.device("cpu"), torch.float64)
    assert torch.equal(w, performer_projection(32, 16, torch.device("cpu"), torch.float64))
    block = w[:16] / w[:16].norm(dim=1, keepdim=True)
    assert torch.allclose(block @ block.T, torch.eye(16, dtype=torch.float64), atol=1e-10)


def test_cosformer_weights_follow_the_distance():
    # one key and one query feature: output weights are exactly cos(pi/2 * (i-j)/M) ratios
    s = parse_attention("cosformer:8")
    t = 4
    q = torch.ones(1, 1, t, 1)
    v = torch.arange(t, dtype=torch.float32).view(1, 1, t, 1)
    out = attend(q, q.clone(), v, s)[0, 0, :, 0]
    w = torch.cos(torch.pi / 2 * torch.arange(t) / 8)  # weight by distance 0, 1, 2, 3
    expected = torch.stack([(w[: i + 1].flip(0) * torch.arange(i + 1)).sum() / w[: i + 1].sum() for i in range(t)])
    assert torch.allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize(
    "spec",
    ["local:64", "dilated:16:4", "longformer:64:16", "bigbird:64:16:2", "linear", "performer:32", "sima", "msla:5", "convmod:7"],
)  # fmt: skip  (hydra: no matmul for the counter to see)
def test_cpu_cost_grows_linearly_with_length(spec):
    """Forward and backward FLOPs double when the length doubles (full softmax would quadruple).  Counted on the
    torch paths (the compiled window kernel of local / dilated is off: its products are invisible to the counter)."""
    s = parse_attention(spec)

    def flops(t):
        q, k, v = qkv(s, t, b=1, h=2, requires_grad=True)
        w = mix(s, h=2)
        with FlopCounterMode(display=False) as counter, native.disabled():
            attend(q, k, v, s, w).sum().backward()
        return counter.get_total_flops()

    ratio = flops(1024) / flops(512)
    assert 1.9 <= ratio <= 2.1, ratio


def test_strided_and_fixed_cost_grows_as_t_to_the_1_5():
    """With S ~ sqrt(T) (the Sparse Transformer's choice) the cost is O(T sqrt T): 4x the length, 8x the FLOPs."""
    for kind in ("strided", "fixed"):
        counts = []
        for t, stride in ((1024, 32), (4096, 64)):
            s = parse_attention(f"{kind}:{stride}")
            q, k, v = qkv(s, t, b=1, h=1)
            with FlopCounterMode(display=False) as counter, native.disabled():  # the engine's GEMMs, which torch counts
                attend(q, k, v, s)
            counts.append(counter.get_total_flops())
        assert 7.5 <= counts[1] / counts[0] <= 8.5, (kind, counts)  # quadratic would be 16


@pytest.mark.parametrize("kind", SPARSE)
def test_patterns_work_as_flex_mask_mods(kind):
    """The CUDA path turns a pattern into a FlexAttention mask_mod (vmapped over indices)."""
    from torch.nn.attention.flex_attention import create_mask

    spec = parse_attention(next(s for s in SPECS if s.startswith(kind + ":")))
    pattern = REGISTRY[kind].pattern
    mask = create_mask(lambda b, h, qi, ki: pattern(qi, ki, spec), 1, 1, 100, 100, device="cpu")
    assert torch.equal(mask[0, 0], patterns.dense_mask(pattern, spec, 100))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_path_matches_reference_and_refuses_endless_recompiles(monkeypatch):
    """The flex glue (block-mask cache, kernel accounting), run eagerly on CPU in place of the compiled kernel."""
    from torch.nn.attention.flex_attention import flex_attention

    monkeypatch.setattr(flex, "_compiled_flex", lambda: flex_attention)
    monkeypatch.setattr(flex, "_KERNELS", set())
    monkeypatch.setattr(flex, "MAX_KERNELS", 2)
    s = parse_attention("bigbird:8:3:2")
    for t in (64, 96):
        q, k, v = qkv(s, t)
        out = REGISTRY["bigbird"].forward_cuda(q, k, v, s, {})
        assert (out - attend_reference(q, k, v, s)).abs().max().item() <= 1e-5
    q, k, v = qkv(s, 128)
    with pytest.raises(RuntimeError, match=r"compiled 2 kernels .* bigbird:8:3:2 at \(2, 4, 128, 16\) would compile another"):
        REGISTRY["bigbird"].forward_cuda(q, k, v, s, {})


# --------------------------------------------------------------------------- models

ALL_TYPES = ["softmax", "gqa:2", "local:8", "dilated:4:3", "strided:8", "fixed:8", "longformer:8:4", "bigbird:8:4:2",
             "linear", "relu-linear", "cosformer:64", "performer:16",
             "hydra", "sima", "lsra:3", "msla:3", "convmod:4"]  # fmt: skip


@pytest.fixture(scope="module")
def every_type_space():
    text = (
        "task: causal-lm\nvocab_size: 64\nmax_seq_len: 64\nhead_dim: 8\npositions: rope\n"
        "embed_dim: [24, 32]\ndepth: [1, 2, 3]\n"
        f"layers: {{heads: [1, 2, 4], ffn_dim: [16, 32], attention: [{', '.join(repr(a) for a in ALL_TYPES)}]}}\n"
        "latency: {prefill: {batch_size: 1, seq_len: 64}}\n"
    )
    return parse_space(text, where="every_type.yaml")


def test_every_type_extracts_and_counts_exactly(every_type_space):
    space = every_type_space
    model = SuperTransformer(space, generator=torch.Generator().manual_seed(0)).eval()
    x = torch.randint(0, 64, (2, 50), generator=torch.Generator().manual_seed(1))
    rng = np.random.default_rng(0)
    subnets = [Subnet(32, 3, (4, 2, 1), (32, 16, 32), (a, a, a)) for a in ALL_TYPES] + [space.sample(rng) for _ in range(8)]
    for subnet in subnets:
        static = extract(model, subnet).eval()
        with torch.no_grad():
            assert (static(x) - model(x, subnet)).abs().max().item() <= 1e-5, subnet
        assert model.num_params(subnet) == static.num_params()
        fresh = Transformer(TransformerConfig.from_subnet(space, subnet))
        fresh.load_state_dict(static.state_dict())  # the from-scratch model has the same shapes
    mix = sum(p.numel() for n, p in model.named_parameters() if ".mix." in n)  # lsra:3 (2 conv heads), msla:3, convmod:4
    assert mix == 3 * (2 * 8 * 3 + 3 * 4 * 8 * 3 + 4 * 8 * 4)
    assert model.num_params(space.largest()) + mix == sum(p.numel() for p in model.parameters())


def test_gqa_uses_the_leading_key_value_rows(every_type_space):
    space = every_type_space
    model = SuperTransformer(space, generator=torch.Generator().manual_seed(0))
    gqa, full = (Subnet(32, 1, (4,), (32,), (a,)) for a in ("gqa:2", "softmax"))
    hd = space.head_dim
    assert model.num_params(full) - model.num_params(gqa) == 2 * (32 * 2 * hd + 2 * hd)  # K and V lose 2 heads
    static = extract(model, gqa)
    assert static.blocks[0].attn.k.weight.shape == (2 * hd, 32) and static.blocks[0].attn.q.weight.shape == (4 * hd, 32)
    model(torch.randint(0, 64, (1, 20)), gqa).sum().backward()
    kgrad = model.blocks[0].attn.k.weight.grad
    assert kgrad[: 2 * hd, :32].abs().sum() > 0 and kgrad[2 * hd :].abs().sum() == 0


def test_model_is_causal_for_each_type(every_type_space):
    model = SuperTransformer(every_type_space, generator=torch.Generator().manual_seed(0)).eval()
    x = torch.randint(0, 64, (1, 60), generator=torch.Generator().manual_seed(2))
    y = x.clone()
    y[0, 30:] = (y[0, 30:] + 1) % 64
    for kind in ALL_TYPES:
        subnet = Subnet(32, 2, (4, 4), (32, 32), (kind, kind))
        with torch.no_grad():
            out_x, out_y = model(x, subnet), model(y, subnet)
        assert torch.equal(out_x[:, :30], out_y[:, :30]), kind
        assert not torch.allclose(out_x[:, 30:], out_y[:, 30:]), kind


def test_latency_features_tell_attention_types_apart(every_type_space):
    space = every_type_space
    a, b = (Subnet(32, 1, (2,), (32,), (t,)) for t in ("softmax", "bigbird:8:4:2"))
    assert not np.array_equal(space.encode(a), space.encode(b))
    assert {f"l0.attn={t}" for t in ALL_TYPES} <= set(space.feature_names())
    assert space.decode(space.encode(b)) == b


def test_onnx_round_trip_of_every_type(tmp_path):
    """One exported model holds a layer of every type; ONNX Runtime matches torch at several shapes."""
    layers = tuple(LayerChoice(2, 16, a) for a in ALL_TYPES)
    config = TransformerConfig(vocab_size=64, max_seq_len=64, head_dim=8, positions="rope", embed_dim=16, layers=layers)
    model = Transformer(config, generator=torch.Generator().manual_seed(0)).eval()
    path = export_onnx(model, tmp_path / "every_type.onnx")
    fused = [a for a in ALL_TYPES if REGISTRY[parse_attention(a).kind].fused_onnx]
    block_local = [a for a in ALL_TYPES if parse_attention(a).kind in BLOCK_LOCAL_ONNX]
    assert len(fused) == len(ALL_TYPES) - len(LINEAR) - 4 - len(block_local)  # (hydra, sima, msla, convmod: no softmax)
    assert op_counts(path)["Attention"] == len(fused)  # one fused node each, sparse ones with a mask
    assert op_counts(path)["Softmax"] == len(block_local)  # the block-local graphs: MatMul / Softmax
    g = torch.Generator().manual_seed(1)
    for shape in [(1, 5), (3, 37), (2, 64)]:  # dynamic batch and sequence axes; lengths off every block size
        assert onnx_parity(path, model, torch.randint(0, 64, shape, generator=g)) <= 1e-4


def test_every_type_documented_and_parameters_named():
    for kind, typ in types().items():
        assert typ.doc and all(p.isupper() for p in typ.params) and typ is REGISTRY[kind], kind


# the new types' cost, counted by hand: B=2, H=4 heads of D=16, T=64 tokens, K taps; decode at context C=100
NEW_TYPE_COSTS = {
    # spec: (prefill mixing FLOPs, decode mixing FLOPs, decode state bytes)
    "hydra": (10 * 2 * 4 * 64 * 16, 10 * 2 * 4 * 16, 4 * 2 * 4 * 16),  # normalise q, k; k*v; sum; mean; gate. State (H, D)
    "sima": (2 * 2 * 4 * (2 * 64 * 64 * 16 + 2 * 64 * 16 * 16) + 6 * 2 * 4 * 64 * 16,  # chunked k v^T + the l1 norms
             4 * 2 * 4 * 16 * 16 + 6 * 2 * 4 * 16, 4 * 2 * 4 * (16 * 16 + 16)),  # state (H, D, D) + key norms (H, D)
    "convmod:5": (2 * 2 * 64 * 64 * 5 + 2 * 64 * 64, 2 * 2 * 64 * 5 + 2 * 64, 4 * 2 * 4 * 4 * 16),  # conv + gate; last K-1 q
    "lsra:5": (4 * 2 * 2 * (64 * 65 // 2) * 16 + 2 * 2 * 64 * 32 * 5 + 2 * 2 * 64 * 32,  # 2 heads attend, 2 convolve + GLU
               4 * 2 * 2 * 101 * 16 + 2 * 2 * 32 * 5 + 2 * 2 * 32,  # one query over 101 keys; one conv step
               4 * 2 * (2 * 2 * 101 * 16 + 2 * 4 * 16)),  # k, v of 2 heads at 101 entries + the GLU window (2, K-1, D)
    "msla:5": (2 * 2 * 2 * 4 * (2 * 64 * 64 * 16 + 2 * 64 * 16 * 16) + 3 * 2 * 2 * 64 * 64 * 5,  # 2 relu-linear + 3 convs
               2 * 4 * 2 * 4 * 16 * 16 + 3 * 2 * 2 * 64 * 5,
               4 * 2 * (2 * 4 * (16 * 16 + 16) + 3 * 4 * 4 * 16)),  # two linear states + the q, k, v windows
}  # fmt: skip


@pytest.mark.parametrize("spec", list(NEW_TYPE_COSTS))
def test_new_types_cost_what_a_hand_count_says(spec):
    from latency.features import layer_cache_bytes, mixing_flops
    from search_spaces import Workload

    prefill, decode, state = NEW_TYPE_COSTS[spec]
    s = parse_attention(spec)
    assert mixing_flops(s, Workload("p", 2, 64), 4, 16) == prefill
    assert mixing_flops(s, Workload("d", 2, 0, "decode", 100), 4, 16) == decode
    assert layer_cache_bytes(s, 100, 4, 16, batch=2) == state


@pytest.mark.parametrize("spec", ["xca", "linformer:8", "msla:3", "lsra:3", "convmod:3"])
def test_a_layer_built_alone_holds_its_types_initial_weights(spec):
    """A bare attention layer (a benchmark's Block) gets the type's own weights as the type initialises them, not
    uninitialised memory (xca's temperature was garbage there, and its gradients subnormal)."""
    from supernet.model import Attention

    s = parse_attention(spec)
    layer = Attention(16, 2, 8, s, max_seq_len=32)
    g = torch.Generator().manual_seed(0)
    assert layer.mix, spec
    for name, p in layer.mix.items():
        want = torch.empty_like(p)
        REGISTRY[s.kind].init_weight(name, want, g)
        assert torch.isfinite(p).all() and torch.equal(p.detach(), want), (spec, name)

"""Long Range Arena's attention types (issue 41), encoder-only: ``nystrom:M``, ``synthesizer-dense``,
``synthesizer-random``, ``reformer:B``, ``sinkhorn:B``.  Each fast path equals its reference in float64 and
float32 (forward and gradients, the type's own weights included) at lengths on and off its blocks, each
reference is its paper's definition, encoder models with them extract and export to ONNX with ONNX Runtime
parity, two calls give the same output, and their cost grows as their papers say."""

import numpy as np
import pytest
import torch

from search_spaces import LayerChoice, SpaceError, Subnet, parse_space
from search_spaces.attention import parse_attention
from supernet import SuperTransformer, Transformer, TransformerConfig, extract
from supernet.attention import attend, attend_reference, get
from supernet.onnx_export import export_onnx, onnx_parity, op_counts

from tests.supernet.attention.test_attention_types import mix, qkv
from tests.supernet.test_bidirectional import ENCODER
from tests.supernet.test_train import one_thread  # noqa: F401  (autouse)

LRA = ["nystrom:1", "nystrom:4", "nystrom:8", "synthesizer-dense", "synthesizer-random", "reformer:1", "reformer:4",
       "reformer:8", "reformer:64", "sinkhorn:3", "sinkhorn:5", "sinkhorn:8", "sinkhorn:64"]  # fmt: skip
LENGTHS = (16, 37, 64, 5)  # on and off every block size; 5: one block or chunk, fewer tokens than landmarks


def _inputs(s, t, dtype, seed):
    q, k, v = (x.to(dtype).requires_grad_() if x is not None else None for x in qkv(s, t, seed=seed))
    w = {n: x.to(dtype).requires_grad_() for n, x in mix(s, max_seq_len=64).items()}
    return q, k, v, w


@pytest.mark.parametrize("spec", LRA)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_fast_path_equals_reference_forward_and_gradients(spec, dtype):
    s = parse_attention(spec)
    typ = get(s)
    assert typ.forms == ("bidirectional",) and type(typ).bidirectional is not type(typ).bidirectional_reference
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    for t in LENGTHS:
        q, k, v, w = _inputs(s, t, dtype, seed=t)
        fast, ref = attend(q, k, v, s, w, causal=False), attend_reference(q, k, v, s, w, causal=False)
        assert fast.shape == ref.shape == q.shape and fast.dtype == dtype
        assert (fast - ref).abs().max().item() <= tol * max(1.0, ref.abs().max().item()), (spec, t)
        inputs = [x for x in (q if s.kind != "synthesizer-random" else None, k, v, *w.values()) if x is not None]
        grad_out = torch.randn(fast.shape, generator=torch.Generator().manual_seed(99), dtype=dtype)
        fast_grads, ref_grads = torch.autograd.grad(fast, inputs, grad_out), torch.autograd.grad(ref, inputs, grad_out)
        for a, b in zip(fast_grads, ref_grads):
            assert (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item()), (spec, t)
        # (reformer:1: chunks of one token put all the weight on the token before, none on q; sinkhorn, one block:
        # nothing to sort, no gradient to the sorting network)
        if spec != "reformer:1" and not (s.kind == "sinkhorn" and t <= s.params[0]):
            assert all(g.abs().sum() > 0 for g in fast_grads), spec  # every input and weight trains


@pytest.mark.parametrize("spec", LRA)
def test_two_calls_give_the_same_output(spec):
    s = parse_attention(spec)
    q, k, v = qkv(s, 37)
    w = mix(s, max_seq_len=64)
    assert torch.equal(attend(q, k, v, s, w, causal=False), attend(q, k, v, s, w, causal=False))


@pytest.mark.parametrize("spec", [a for a in LRA if not a.startswith("reformer")])  # (reformer: its chunks)
def test_every_query_sees_every_token(spec):
    s = parse_attention(spec)
    q, k, v = qkv(s, 40)
    w = mix(s, max_seq_len=64)
    v2 = v.clone()
    v2[:, :, 39] += 1.0  # the last token's value
    moved = (attend(q, k, v2, s, w, causal=False) - attend(q, k, v, s, w, causal=False)).abs().amax(dim=(0, 1, 3))
    assert moved[0] > 1e-6, moved  # the first token sees it


# --------------------------------------------------------------------------- nystrom


def _separated(t, m, d=16, scale=2.0, seed=0):
    """q = k whose M segments point along orthogonal directions: a well-conditioned landmark kernel."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0][:m] * scale * d**0.25
    q = basis.repeat_interleave(t // m, 0)[None, None] + 0.1 * torch.randn(1, 2, t, d, generator=g, dtype=torch.float64)
    return q, q.clone(), torch.randn(1, 2, t, d, generator=g, dtype=torch.float64)


def test_nystrom_iterative_pinv_is_close_to_the_exact_one():
    from supernet.attention.nystrom import _kernels, iterative_pinv, nystrom_exact

    q, k, v = _separated(64, 8, scale=1.0)
    a = _kernels(q, k, 8)[1]  # the (M, M) landmark kernel, condition number about 6
    exact = torch.linalg.pinv(a)
    errors = [((iterative_pinv(a, n) - exact).norm() / exact.norm()).item() for n in (1, 3, 6)]
    assert errors[0] > 0.5 and errors[1] > 0.1 and errors[2] < 1e-10, errors  # it converges within the paper's 6
    s = parse_attention("nystrom:8")
    torch.testing.assert_close(attend_reference(q, k, v, s, {}, causal=False), nystrom_exact(q, k, v, 8), rtol=1e-9, atol=1e-9)


def test_nystrom_with_a_landmark_per_token_is_softmax_attention():
    from supernet.attention.nystrom import nystrom_exact

    q, k, v = _separated(8, 8, scale=3.0)
    full = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1) @ v  # sqrt(D) = 4
    torch.testing.assert_close(nystrom_exact(q, k, v, 8), full)  # A pinv(A) A v = A v
    torch.testing.assert_close(attend_reference(q, k, v, parse_attention("nystrom:8"), {}, causal=False), full)


def test_nystrom_landmarks_are_the_papers_padded_segment_means():
    from supernet.attention.nystrom import segment_means

    x = torch.arange(2 * 7 * 3, dtype=torch.float64).reshape(1, 2, 7, 3)
    means = segment_means(x, 3)  # segments of ceil(7/3) = 3 tokens: 0-2, 3-5, 6 and two zero rows
    torch.testing.assert_close(means[0, 1, 0], x[0, 1, 0:3].mean(0))
    torch.testing.assert_close(means[0, 1, 2], x[0, 1, 6] / 3)
    assert segment_means(x, 8)[0, 0, 7].abs().sum() == 0  # more landmarks than tokens: all-padding ones are zero


# --------------------------------------------------------------------------- synthesizers


def test_synthesizer_dense_reference_is_the_definition():
    s = parse_attention("synthesizer-dense")
    q, _, v = qkv(s, 6, b=1, h=2, d=4)
    w = mix(s, h=2, d=4, max_seq_len=10)
    out = torch.empty_like(q)
    for h in range(2):
        for i in range(6):  # logits over the 6 positions: relu(q_i) W2[:, j] + b2[j], the leading 6 of the 10 columns
            logits = torch.stack([(torch.relu(q[0, h, i]) * w["w"][h, :, j]).sum() + w["b"][h, j] for j in range(6)])
            out[0, h, i] = sum(p * v[0, h, j] for j, p in enumerate(logits.softmax(0)))
    torch.testing.assert_close(attend_reference(q, None, v, s, w, causal=False), out)


def test_synthesizer_random_reference_is_the_definition_and_ignores_the_input():
    s = parse_attention("synthesizer-random")
    q, _, v = qkv(s, 5, b=2, h=2, d=4)
    w = mix(s, h=2, d=4, max_seq_len=9)
    out = attend_reference(q, None, v, s, w, causal=False)
    for h in range(2):
        a = w["r"][h, :5, :5].softmax(-1)  # the leading 5 x 5 block of the (9, 9) logits
        torch.testing.assert_close(out[:, h], a @ v[:, h])
    torch.testing.assert_close(attend(q * 3.0 + 1.0, None, v, s, w, causal=False), out)  # no query enters


@pytest.mark.parametrize("spec", ["synthesizer-dense", "synthesizer-random"])
def test_synthesizer_weights_are_sliced_elastically(spec):
    space = parse_space(ENCODER.format(attention=f"softmax, '{spec}'"))
    supernet = SuperTransformer(space, torch.Generator().manual_seed(0))
    kind = parse_attention(spec).kind
    full = supernet.blocks[0].attn.mix[kind].w
    want = {"w": (4, 8, 48), "b": (4, 48)} if kind == "synthesizer-dense" else {"r": (4, 48, 48)}
    assert {n: tuple(p.shape) for n, p in full.items()} == want  # the most heads x max_seq_len
    sub = Subnet(16, 1, (2,), (16,), (spec,))
    idx = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(3))
    supernet(idx, sub).square().mean().backward()
    for name, p in full.items():  # a layer of 2 heads over 20 tokens trains the leading 2 heads' 20 positions only
        g = p.grad.clone()
        lead = g[:2, ..., :20] if name != "r" else g[:2, :20, :20]
        assert lead.abs().amin() > 0, (spec, name)
        lead.zero_()
        assert g.abs().sum() == 0, (spec, name)
    static = extract(supernet, sub)
    assert {n: tuple(t.shape) for n, t in static.blocks[0].attn.mix.items()} == {n: (2, *s[1:]) for n, s in want.items()}
    assert static.blocks[0].attn.k is None  # no keys


# --------------------------------------------------------------------------- reformer


@pytest.mark.parametrize("t, b", [(13, 3), (16, 4), (5, 8), (9, 4)])
def test_reformer_is_the_papers_lsh_attention_row_by_row(t, b):
    from supernet.attention.reformer import MAX_ROTATIONS, REFORMER_SEED

    s = parse_attention(f"reformer:{b}")
    g = torch.Generator().manual_seed(t)
    q, v = torch.randn(1, 2, t, 4, generator=g, dtype=torch.float64), torch.randn(1, 2, t, 4, generator=g, dtype=torch.float64)
    n = -(-t // b)  # chunks of b; n/2 rounded up random directions, their opposites: 2 ceil(n/2) buckets
    table = np.random.default_rng([REFORMER_SEED, 4]).standard_normal((MAX_ROTATIONS, 4))[: (n + 1) // 2]
    out = torch.empty_like(q)
    for h in range(2):
        proj = q[0, h].numpy() @ table.T
        bucket = np.argmax(np.concatenate([proj, -proj], axis=1), axis=1)
        order = sorted(range(t), key=lambda i: (bucket[i], i))
        chunk = {tok: place // b for place, tok in enumerate(order)}
        for i in range(t):
            keys = [j for j in range(t) if chunk[j] in (chunk[i], (chunk[i] - 1) % n)]
            kn = q[0, h] / q[0, h].norm(dim=-1, keepdim=True)  # shared QK: unit-length keys
            scores = torch.stack([q[0, h, i] @ kn[j] / 2.0 if j != i else torch.tensor(-1e5, dtype=q.dtype) for j in keys])
            out[0, h, i] = sum(p * v[0, h, j] for j, p in zip(keys, scores.softmax(0)))
    torch.testing.assert_close(attend_reference(q, None, v, s, {}, causal=False), out)
    torch.testing.assert_close(attend(q, None, v, s, {}, causal=False), out)


def test_reformer_hash_is_seeded_local_and_leaves_the_global_generator_alone():
    from supernet.attention.reformer import reformer_sort

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 64, 16, generator=g)
    q[0, 0, 40] = q[0, 0, 3] * 2.0  # the same direction: the same bucket
    state = torch.random.get_rng_state()
    buckets, order = reformer_sort(q, 8)
    assert torch.equal(torch.random.get_rng_state(), state)  # no global RNG
    assert buckets[0, 0, 40] == buckets[0, 0, 3] and buckets.max() < 8 and len(buckets.unique()) > 4  # 8 chunks: 8 buckets
    assert torch.equal(reformer_sort(q.clone(), 8)[1], order)
    half = q.to(torch.bfloat16)  # bf16 queries hash as their float32 values: no near-tie flipped by a bf16 product
    assert torch.equal(reformer_sort(half, 8)[0], reformer_sort(half.float(), 8)[0])
    # the two tokens are neighbours after the sort (same bucket, nothing of it between their positions but its own)
    rank = torch.argsort(order[0, 0])
    between = [i for i in range(64) if rank[3] < rank[i] < rank[40]]
    assert all(buckets[0, 0, i] == buckets[0, 0, 3] for i in between)


# --------------------------------------------------------------------------- sinkhorn


def test_sinkhorn_normalisation_is_doubly_stochastic_and_sharpens_to_a_permutation():
    from supernet.attention.sinkhorn import sinkhorn

    g = torch.Generator().manual_seed(0)
    p = sinkhorn(torch.randn(3, 5, 5, generator=g, dtype=torch.float64))
    torch.testing.assert_close(p.sum(-2), torch.ones(3, 5, dtype=torch.float64))  # columns (normalised last)
    torch.testing.assert_close(p.sum(-1), torch.ones(3, 5, dtype=torch.float64), atol=1e-2, rtol=0)  # rows, nearly
    perm = torch.tensor([2, 0, 4, 1, 3])
    peaked = sinkhorn(10.0 * torch.eye(5, dtype=torch.float64)[perm])
    assert torch.equal(peaked.argmax(-1), perm) and peaked.amax(-1).min() > 0.99


@pytest.mark.parametrize("t", [7, 8])
def test_sinkhorn_reference_is_the_definition_row_by_row(t):
    from supernet.attention.sinkhorn import sinkhorn

    s = parse_attention("sinkhorn:4")
    q, k, v = qkv(s, t, b=1, h=2, d=4, seed=t)
    w = mix(s, h=2, d=4, max_seq_len=12)  # w2 spans 3 blocks; a layer of 2 blocks uses 2 columns
    out = torch.empty_like(q)
    for h in range(2):
        rows = [list(range(0, 4)), list(range(4, t))]  # block 1 of 7 tokens: 3 real, 1 padding
        kbar = torch.stack([sum(k[0, h, j] for j in r) / 4 for r in rows])  # padding counts as a zero row
        p = sinkhorn((torch.relu(kbar @ w["w1"][h]) @ w["w2"][h, :, :2])[None])[0]  # (2, 2)
        for n, r in enumerate(rows):
            keys, vals, bias = [k[0, h, j] for j in r], [v[0, h, j] for j in r], [0.0] * len(r)
            for slot in range(4):  # slot c of the block sorted to n: p[n, m] times slot c of block m (zero if padding)
                src = [(m, rows[m][slot]) for m in range(2) if slot < len(rows[m])]
                keys.append(sum(p[n, m] * k[0, h, j] for m, j in src))
                vals.append(sum(p[n, m] * v[0, h, j] for m, j in src))
                bias.append(torch.log(sum(p[n, m] for m, _ in src)))  # the share of real tokens mixed into the slot
            for i in r:
                scores = torch.stack([q[0, h, i] @ kk / 2.0 + b for kk, b in zip(keys, bias)])
                out[0, h, i] = sum(a * vv for a, vv in zip(scores.softmax(0), vals))
    torch.testing.assert_close(attend_reference(q, k, v, s, w, causal=False), out)
    torch.testing.assert_close(attend(q, k, v, s, w, causal=False), out)


# --------------------------------------------------------------------------- the space layer and models

SPACE_TYPES = ["nystrom:4", "synthesizer-dense", "synthesizer-random", "reformer:8", "sinkhorn:8"]


def test_a_causal_space_refuses_them_and_a_too_long_parameter_is_refused():
    for spec in SPACE_TYPES:
        text = ENCODER.format(attention=f"softmax, '{spec}'").replace("task: masked-lm", "task: causal-lm")
        with pytest.raises(SpaceError) as info:
            parse_space(text, where="dec.yaml")
        assert info.value.errors == [f"dec.yaml: layers.attention[1]: {spec} has no causal form, which task causal-lm needs"]
    with pytest.raises(SpaceError) as info:
        parse_space(ENCODER.format(attention="'nystrom:64', 'reformer:49', 'sinkhorn:50', 'reformer:48'"), where="enc.yaml")
    assert info.value.errors == [
        "enc.yaml: layers.attention[0]: nystrom:64: M=64 exceeds max_seq_len 48 (more landmarks than tokens)",
        "enc.yaml: layers.attention[1]: reformer:49: B=49 exceeds max_seq_len 48 (a bucket longer than the sequence)",
        "enc.yaml: layers.attention[2]: sinkhorn:50: B=50 exceeds max_seq_len 48 (a block longer than the sequence)",
    ]
    from supernet.attention.reformer import MAX_ROTATIONS

    assert get("reformer:1").problems(parse_attention("reformer:1"), 2 * MAX_ROTATIONS, (4,)) == []
    assert get("reformer:1").problems(parse_attention("reformer:1"), 2 * MAX_ROTATIONS + 1, (4,)) == [
        f"reformer:1: max_seq_len {2 * MAX_ROTATIONS + 1} needs more than {2 * MAX_ROTATIONS} buckets of 1"]


@pytest.fixture(scope="module")
def encoder():
    space = parse_space(ENCODER.format(attention=", ".join(f"'{a}'" for a in ["softmax", *SPACE_TYPES])))
    return space, SuperTransformer(space, torch.Generator().manual_seed(0)).eval()


def test_encoder_models_with_each_type_extract_and_count(encoder):
    space, supernet = encoder
    subnets = [Subnet(24, 2, (4, 2), (32, 16), (a, a)) for a in SPACE_TYPES]
    subnets += [space.sample(np.random.default_rng(s)) for s in range(3)]
    idx = torch.randint(0, 64, (2, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for sub in subnets:
            static = extract(supernet, sub).eval()
            assert (static(idx) - supernet(idx, sub)).abs().max().item() <= 1e-5, sub
            assert supernet.num_params(sub) == static.num_params()
            Transformer(TransformerConfig.from_subnet(space, sub)).load_state_dict(static.state_dict())


def test_onnx_export_matches_onnx_runtime(tmp_path):
    """One exported encoder holds a layer of each type; ONNX Runtime matches torch at several shapes."""
    layers = tuple(LayerChoice(2, 16, a) for a in SPACE_TYPES)
    config = TransformerConfig(64, 64, 8, "rope", 16, layers, causal=False)
    model = Transformer(config, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # sinkhorn's sorting network sharper than at its initialisation, so its permutation matters
        model.blocks[-1].attn.mix["w2"].mul_(4.0)
    path = export_onnx(model.eval(), tmp_path / "enc.onnx")
    assert op_counts(path)["Attention"] == 1  # synthesizer-dense's fused node
    assert op_counts(path)["TopK"] >= 1  # reformer's sort
    g = torch.Generator().manual_seed(1)
    for shape in [(1, 16), (3, 37), (2, 64), (1, 5)]:  # dynamic batch and length, on and off the blocks, the longest
        assert onnx_parity(path, model, torch.randint(0, 64, shape, generator=g)) <= 1e-4, shape


def test_stitched_timing_graph_computes_them(tmp_path):
    """The latency table's stitched timing graph: one generic part per type (those spanning the sequence traced with
    the model's max_seq_len), weights attached, ONNX Runtime equal to torch."""
    from latency.onnx_graphs import cached_graph, with_weights
    from supernet.onnx_export import onnx_session

    layers = (LayerChoice(2, 32, "sinkhorn:8"), LayerChoice(2, 32, "softmax"))  # (sinkhorn: its block count and the
    # sorting network's columns symbolic together in a generic part; the others trace as in the whole export above)
    encoder = Transformer(TransformerConfig(64, 32, 8, "rope", 24, layers, causal=False),
                          generator=torch.Generator().manual_seed(0)).eval()  # fmt: skip
    graph, tensors = cached_graph(encoder, tmp_path)
    session = onnx_session(with_weights(graph, tensors, encoder, tmp_path / "own"), threads=1)
    for shape in [(1, 7), (2, 32)]:
        tokens = torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            expected = encoder(tokens).numpy()
        assert np.abs(session.run(None, {"input_ids": tokens.numpy()})[0] - expected).max() < 1e-4, shape


def test_they_train_under_bf16_autocast_close_to_fp32():
    """bf16 autocast (how training runs on CUDA), checked on the CPU as tests/supernet/test_autocast.py does for every type."""
    layers = tuple(LayerChoice(2, 16, a) for a in SPACE_TYPES)
    config = TransformerConfig(64, 48, 8, "rope", 16, layers, causal=False)
    model = Transformer(config, generator=torch.Generator().manual_seed(0))
    idx = torch.randint(0, 64, (2, 37), generator=torch.Generator().manual_seed(1))
    runs = []
    for amp in (False, True):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            logits = model(idx)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), idx.flatten())
        loss.backward()  # (synthesizer-random's query projection gets no gradient: zeros)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
        runs.append((logits.float().detach(), torch.cat([g.flatten() for g in grads])))
    (l32, g32), (l16, g16) = runs
    assert l16.isfinite().all() and g16.isfinite().all()
    assert (l16 - l32).abs().max().item() <= 0.05 * l32.abs().max().item()
    assert torch.nn.functional.cosine_similarity(g16, g32, dim=0).item() >= 0.99


# --------------------------------------------------------------------------- cost


def test_latency_features_cost_them_by_their_own_count():
    from latency.features import mixing_flops
    from search_spaces import Workload

    for spec in SPACE_TYPES:
        assert mixing_flops(parse_attention(spec), Workload("p", 2, 48), 4, 16, causal=False) == _flops(spec, 48, 2, 4, 16), spec


def _flops(spec, t, batch=1, heads=4, head_dim=64):
    return get(spec).bidirectional_flops(parse_attention(spec), batch, t, heads, head_dim)


def test_costs_grow_as_the_papers_say():
    softmax = [_flops("softmax", t) for t in (1024, 2048, 4096)]
    assert softmax[2] / softmax[1] == pytest.approx(4.0)  # quadratic
    nys = [_flops("nystrom:64", t) for t in (1024, 2048, 3072)]
    assert nys[2] - 2 * nys[1] + nys[0] == 0 and nys[2] < softmax[1] / 4  # affine in T (the M^3 pseudo-inverse fixed)
    assert _flops("nystrom:64", 2048, batch=2, heads=8) == 4 * _flops("nystrom:64", 2048)
    ref = [_flops("reformer:64", t) for t in (1024, 2048, 4096)]
    assert 2.0 < ref[2] / ref[1] < 2.3 and ref[2] < softmax[2] / 8  # O(T B D) + the sort's T log T + the hash's T^2 D / B
    sink = [_flops("sinkhorn:64", t) for t in (1024, 2048, 4096)]
    assert 2.0 < sink[2] / sink[1] < 2.5 and sink[2] < softmax[2] / 8  # O(T B D) + the sorting's O(T^2 D / B)
    for spec in ("synthesizer-dense", "synthesizer-random"):  # quadratic, as the paper says
        syn = [_flops(spec, t) for t in (1024, 2048, 4096)]
        assert 3.9 < syn[2] / syn[1] <= 4.0, spec
    # by hand, B=2, H=4, D=16, T=64: dense: relu, logits + bias, softmax, weighted sum; random: softmax once per head
    assert get("synthesizer-dense").bidirectional_flops(parse_attention("synthesizer-dense"), 2, 64, 4, 16) == 2 * 4 * (
        64 * 16 + 2 * 64 * 64 * 16 + 64 * 64 + 3 * 64 * 64 + 2 * 64 * 64 * 16)
    assert _flops("synthesizer-random", 64, batch=2, heads=4, head_dim=16) == 4 * 3 * 64 * 64 + 2 * 4 * 2 * 64 * 64 * 16

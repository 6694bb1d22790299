"""The bidirectional forms of local, dilated, longformer, bigbird, hydra, sima and msla: each fast path
equals its reference (forward and gradients, lengths off every block size), each reference is its
definition, encoder models with them extract and export to ONNX exactly, and they cost a hand count."""

import numpy as np
import pytest
import torch

from search_spaces import LayerChoice, Subnet, parse_space
from search_spaces.attention import parse_attention
from supernet import SuperTransformer, Transformer, TransformerConfig, extract
from supernet.attention import attend, attend_reference, get
from supernet.attention.conv import centred_conv_reference, centred_dwconv, centred_offset
from supernet.attention.patterns import dense_mask
from supernet.attention.sparse import bigbird_random_block
from supernet.onnx_export import export_onnx, onnx_parity, op_counts

from tests.supernet.attention.test_attention_types import mix, qkv
from tests.supernet.test_bidirectional import ENCODER
from tests.supernet.test_train import one_thread  # noqa: F401  (autouse)

SPARSE = ["local:1", "local:8", "local:40", "dilated:1:5", "dilated:4:3", "dilated:9:2", "longformer:8:3",
          "longformer:16:40", "bigbird:5:1:3", "bigbird:8:3:2", "bigbird:16:20:1"]  # fmt: skip
OTHERS = ["hydra", "sima", "msla:2", "msla:5"]
NEW_FORMS = SPARSE + OTHERS


def test_types_declare_their_new_form():
    for spec in NEW_FORMS:
        assert get(spec).forms == ("causal", "bidirectional"), spec


@pytest.mark.parametrize("spec", NEW_FORMS)
def test_fast_path_equals_reference_forward_and_gradients(spec):
    s = parse_attention(spec)
    # sima, msla: the reference sums the (T, T) product, the fast path the (D, D) state k^T v first; divided by
    # per-channel sums over every token, the fp32 rounding of the two orders reaches ~2e-5 in the gradients
    grad_tol = 5e-5 if s.kind in ("sima", "msla") else 1e-5
    for t in (1, 17, 70):  # one token; lengths off every block size (16, W); many blocks
        q, k, v = qkv(s, t, seed=t, requires_grad=True)
        w = mix(s, requires_grad=True)
        fast, ref = attend(q, k, v, s, w, causal=False), attend_reference(q, k, v, s, w, causal=False)
        assert fast.shape == ref.shape == q.shape
        assert (fast - ref).abs().max().item() <= 1e-5, (spec, t)
        assert type(get(s)).bidirectional is not type(get(s)).bidirectional_reference
        inputs = [q, k, v, *w.values()]
        grad_out = torch.randn(fast.shape, generator=torch.Generator().manual_seed(99))
        for a, b in zip(torch.autograd.grad(fast, inputs, grad_out), torch.autograd.grad(ref, inputs, grad_out)):
            assert (a - b).abs().max().item() <= grad_tol * max(1.0, b.abs().max().item()), (spec, t)


def _row(spec, i, t):
    s = parse_attention(spec)
    return set(torch.nonzero(dense_mask(get(s).bidirectional_pattern, s, t)[i]).flatten().tolist())


def test_patterns_are_the_documented_ones():
    assert _row("local:3", 5, 12) == {3, 4, 5, 6, 7}
    assert _row("dilated:3:2", 6, 12) == {2, 4, 6, 8, 10}
    assert _row("longformer:3:2", 6, 12) == {0, 1, 4, 5, 6, 7, 8}  # window both ways + the global tokens
    assert _row("longformer:3:2", 1, 12) == set(range(12))  # a global token sees everything
    for spec in ("local:5", "dilated:4:3", "longformer:8:3", "bigbird:4:2:2"):
        s = parse_attention(spec)
        m = dense_mask(get(s).bidirectional_pattern, s, 40)
        assert torch.equal(m, m.T), spec  # symmetric
        assert (m & ~dense_mask(get(s).pattern, s, 40)).any(), spec  # and not the causal pattern


def test_bigbird_random_blocks_go_both_ways_with_the_causal_generator():
    s, w, t = parse_attention("bigbird:4:1:2"), 4, 48
    causal = dense_mask(get(s).pattern, s, t)
    both = dense_mask(get(s).bidirectional_pattern, s, t)
    assert torch.equal(both & causal, causal)  # every causal pick is kept ...
    assert torch.equal(both, both.T)  # ... and its transpose added
    a = 9  # block 9 picked bigbird_random_block(9, r): it sees those blocks and they see it
    for r in range(2):
        b = int(bigbird_random_block(torch.tensor(a), r))
        assert both[a * w, b * w] and both[b * w, a * w], (a, b)


def test_hydra_and_sima_references_are_the_definitions():
    q, k, v = qkv(parse_attention("hydra"), 6, b=1, h=2, d=4)
    n = lambda x: x / x.norm(dim=-1, keepdim=True)  # noqa: E731
    hydra = torch.stack([n(q[0, :, i]) * sum(n(k[0, :, j]) * v[0, :, j] for j in range(6)) / 6 for i in range(6)], 1)
    torch.testing.assert_close(attend_reference(q, k, v, parse_attention("hydra"), causal=False)[0], hydra)
    sima = torch.empty_like(q[0])
    z = k[0].abs().sum(1)  # (H, D): |k| summed over every token per channel
    for i in range(6):
        qh = q[0, :, i] / q[0, :, i].abs().sum(-1, keepdim=True)  # l1-normalised query (H, D)
        sima[:, i] = sum((qh / z * k[0, :, j]).sum(-1, keepdim=True) * v[0, :, j] for j in range(6))
    torch.testing.assert_close(attend_reference(q, k, v, parse_attention("sima"), causal=False)[0], sima)


def test_centred_convolution_taps_are_nearest_first_on_both_sides():
    assert [centred_offset(s) for s in range(6)] == [0, -1, 1, -2, 2, -3]
    x = torch.randn(1, 1, 9, 2, generator=torch.Generator().manual_seed(0))
    for s in range(5):
        w = torch.zeros(2, 5)
        w[:, s] = 1.0  # a one-hot tap: the output is x shifted by its offset, zeros outside the sequence
        o = centred_offset(s)
        want = torch.zeros_like(x)
        for t in range(9):
            if 0 <= t + o < 9:
                want[0, 0, t] = x[0, 0, t + o]
        torch.testing.assert_close(centred_conv_reference(x, w), want)
        torch.testing.assert_close(centred_dwconv(x, w), want)
    x = torch.randn(2, 3, 17, 4, generator=torch.Generator().manual_seed(1))
    w = torch.randn(12, 6, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(centred_dwconv(x, w[:, :3]), centred_conv_reference(x, w[:, :3]))  # msla:3 from msla:6


# --------------------------------------------------------------------------- models


MODEL_FORMS = ["local:5", "dilated:3:2", "longformer:5:2", "bigbird:4:2:1", "hydra", "sima", "msla:3"]


def test_encoder_models_with_each_form_extract_and_see_the_right_tokens():
    space = parse_space(ENCODER.format(attention=", ".join(f"'{a}'" for a in MODEL_FORMS)))
    supernet = SuperTransformer(space, torch.Generator().manual_seed(0)).eval()
    subnets = [Subnet(24, 2, (4, 2), (32, 16), (a, a)) for a in MODEL_FORMS]
    subnets += [space.sample(np.random.default_rng(i)) for i in range(3)]
    idx = torch.randint(0, 64, (2, 43), generator=torch.Generator().manual_seed(1))
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 64  # the last token
    with torch.no_grad():
        for sub in subnets:
            logits = supernet(idx, sub)
            static = extract(supernet, sub).eval()
            assert (static(idx) - logits).abs().max().item() <= 1e-5, sub
            assert supernet.num_params(sub) == static.num_params()
            moved = (supernet(changed, sub) - logits).abs().amax(dim=(0, 2))  # (T,)
            # local / dilated reach a few tokens per layer: the first token is untouched; the others see it
            short = all(parse_attention(a).kind in ("local", "dilated") for a in sub.attention)
            assert (moved[0] == 0) if short else (moved[0] > 1e-6), (sub, moved[0])
            assert moved[-3] > 1e-6  # two tokens before it see the last token (every form, dilated:3:2 too)


def test_onnx_export_of_the_new_forms_matches_onnx_runtime(tmp_path):
    layers = tuple(LayerChoice(2, 16, a) for a in MODEL_FORMS)
    config = TransformerConfig(64, 48, 8, "rope", 16, layers, causal=False)
    model = Transformer(config, generator=torch.Generator().manual_seed(0)).eval()
    path = export_onnx(model, tmp_path / "forms.onnx")
    counts = op_counts(path)
    # bigbird: a masked node; longformer: its global rows; local, dilated: block-local MatMul / Softmax only
    assert counts["Attention"] == 2 and counts["Softmax"] == 3  # the block-local graphs of local, dilated, longformer
    g = torch.Generator().manual_seed(1)
    for shape in [(1, 1), (1, 5), (2, 29), (1, 48)]:  # one token: fewer than G (longformer:5:2)
        assert onnx_parity(path, model, torch.randint(0, 64, shape, generator=g)) <= 1e-4, shape


# --------------------------------------------------------------------------- cost


def _bigbird_pairs(t=64, w=8, g=3, r=2):
    """The window + global pairs (longformer:8:3's 1234), plus each random block pair both ways, less globals."""
    n = t // w
    seen = set()
    for a in range(2, n):
        for k in range(r):
            b = int(bigbird_random_block(torch.tensor(a), k))
            seen |= {(a, b), (b, a)}
    return 1234 + sum(1 for a, b in seen for i in range(a * w, a * w + w) for j in range(b * w, b * w + w) if i >= g and j >= g)


# B=2, H=4 heads of D=16, T=64 tokens, counted by hand; the softmax family: 4 D FLOPs per (query, key) pair
HAND_COSTS = {
    "softmax": 4 * 2 * 4 * 64 * 64 * 16,
    "local:8": 4 * 2 * 4 * (64 * 15 - 2 * 28) * 16,  # 15 keys a row, less 7+6+...+1 missing at each end
    "dilated:4:3": 4 * 2 * 4 * (7 * 64 - 2 * 3 * (1 + 2 + 3)) * 16,  # i + 3m, |m| <= 3, inside the sequence
    # the window (904 pairs); rows 0-2 see all 64 instead of their 8, 9, 10; keys 0-2 outside the window: 56 + 55 + 54
    "longformer:8:3": 4 * 2 * 4 * (904 - 27 + 3 * 64 + 56 + 55 + 54) * 16,
    "bigbird:8:3:2": 4 * 2 * 4 * _bigbird_pairs() * 16,
    "linear": 2 * 2 * 4 * 64 * 16 * (2 * 16 + 1),  # sum_j phi(k_j) v_j^T, phi(q) times it, the normaliser
    "hydra": 9 * 2 * 4 * 64 * 16 + 2 * 4 * 16,  # normalise q, k (3 + 3), k * v, the sum, the gate; / T per channel
    "sima": 4 * 2 * 4 * 64 * 16 * 16 + 6 * 2 * 4 * 64 * 16,  # k^T v, q^ (k^T v); l1 norms, |k| sums, division
    "msla:5": 2 * (2 * 2 * 4 * 64 * 16 * 33) + 3 * 2 * 2 * 64 * 64 * 5,  # two bidirectional relu-linear + 3 convs
}


@pytest.mark.parametrize("spec", list(HAND_COSTS))
def test_bidirectional_forms_cost_what_a_hand_count_says(spec):
    from latency.features import mixing_flops
    from search_spaces import Workload

    s = parse_attention(spec)
    assert mixing_flops(s, Workload("p", 2, 64), 4, 16, causal=False) == HAND_COSTS[spec]
    if spec != "softmax":  # and not what the causal form costs
        assert mixing_flops(s, Workload("p", 2, 64), 4, 16) != HAND_COSTS[spec]


def test_an_encoder_space_costs_its_bidirectional_forms():
    from latency.features import flops
    from search_spaces import Workload

    enc = parse_space(ENCODER.format(attention="'local:8'"))
    dec = parse_space(ENCODER.format(attention="'local:8'").replace("masked-lm", "causal-lm"))
    sub, wl = Subnet(16, 1, (2,), (16,), ("local:8",)), Workload("p", 1, 48)
    pairs_both, pairs_causal = 48 * 15 - 2 * 28, 48 * 8 - 28
    assert flops(enc, sub, wl) - flops(dec, sub, wl) == 4 * 2 * (pairs_both - pairs_causal) * 8

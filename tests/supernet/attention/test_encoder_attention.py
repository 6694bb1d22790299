"""The encoder-only attention types (``linformer:K``, ``additive``, ``xca``): each fast path equals its
reference and the reference its definition, Linformer's projections slice elastically, a causal space
refuses them, encoder models with them extract and export to ONNX exactly, and their cost is a hand count."""

import math

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

ENCODER_ONLY = ["linformer:8", "additive", "xca"]


def test_types_are_encoder_only_and_registered():
    for spec in ENCODER_ONLY:
        typ = get(spec)
        assert typ.forms == ("bidirectional",) and typ.doc, spec
    assert parse_attention("linformer:256").param("K") == 256
    with pytest.raises(ValueError, match="'linformer' must be written linformer:K"):
        parse_attention("linformer")


@pytest.mark.parametrize("spec", ENCODER_ONLY)
def test_fast_path_equals_reference_forward_and_gradients(spec):
    s = parse_attention(spec)
    for t in (1, 17, 70):  # one token; lengths off any block size; past K
        q, k, v = qkv(s, t, seed=t, requires_grad=True)
        w = mix(s, requires_grad=True)
        fast, ref = attend(q, k, v, s, w, causal=False), attend_reference(q, k, v, s, w, causal=False)
        assert fast.shape == ref.shape == q.shape
        assert (fast - ref).abs().max().item() <= 1e-5 * max(1.0, ref.abs().max().item()), (spec, t)  # as the gradients
        inputs = [x for x in (q, k, v, *w.values()) if x is not None]
        grad_out = torch.randn(fast.shape, generator=torch.Generator().manual_seed(99))
        for a, b in zip(torch.autograd.grad(fast, inputs, grad_out), torch.autograd.grad(ref, inputs, grad_out)):
            assert (a - b).abs().max().item() <= 1e-5 * max(1.0, b.abs().max().item()), (spec, t)


def test_linformer_reference_is_the_definition():
    s = parse_attention("linformer:4")
    q, k, v = qkv(s, 6, b=1, h=2, d=4)
    w = mix(s, h=2, d=4)
    out = torch.empty_like(q)
    for h in range(2):
        kp = [sum(w["e"][n, t] * k[0, h, t] for t in range(6)) for n in range(4)]  # E[:, :T] k, row by row
        vp = [sum(w["f"][n, t] * v[0, h, t] for t in range(6)) for n in range(4)]
        for i in range(6):
            scores = torch.stack([(q[0, h, i] * kp[n]).sum() / 2.0 for n in range(4)])  # sqrt(D) = 2
            out[0, h, i] = sum(p * vp[n] for n, p in enumerate(scores.softmax(0)))
    torch.testing.assert_close(attend_reference(q, k, v, s, w, causal=False), out)


def test_additive_reference_is_the_definition():
    s = parse_attention("additive")
    q, _, v = qkv(s, 5, b=1, h=2, d=4)
    w = mix(s, h=2, d=4)
    out = torch.empty_like(q)
    for h in range(2):
        qn = [q[0, h, i] / q[0, h, i].norm() for i in range(5)]
        vn = [v[0, h, i] / v[0, h, i].norm() for i in range(5)]
        logits = torch.stack([(qn[i] * w["wa"][h]).sum() / 2.0 for i in range(5)])  # / sqrt(D)
        alpha = torch.exp(logits) / torch.exp(logits).sum()
        g = sum(alpha[i] * qn[i] for i in range(5))
        for i in range(5):
            out[0, h, i] = w["proj"][h] @ (g * vn[i]) + qn[i]
    torch.testing.assert_close(attend_reference(q, None, v, s, w, causal=False), out)


def test_xca_reference_is_the_definition():
    s = parse_attention("xca")
    q, k, v = qkv(s, 7, b=1, h=2, d=4)
    w = mix(s, h=2, d=4)
    out = torch.empty_like(q)
    for h in range(2):
        qn = q[0, h] / q[0, h].norm(dim=0)  # (T, D): each channel a unit vector over the tokens
        kn = k[0, h] / k[0, h].norm(dim=0)
        for c in range(4):
            a = torch.stack([w["temperature"][h] * (qn[:, c] * kn[:, e]).sum() for e in range(4)]).softmax(0)
            out[0, h, :, c] = sum(a[e] * v[0, h, :, e] for e in range(4))
    torch.testing.assert_close(attend_reference(q, k, v, s, w, causal=False), out)


@pytest.mark.parametrize("spec", ENCODER_ONLY)
def test_every_query_sees_every_token(spec):
    s = parse_attention(spec)
    q, k, v = qkv(s, 20)
    w = mix(s)
    q2, k2, v2 = (x.clone() if x is not None else None for x in (q, k, v))
    for x in (q2, k2, v2):
        if x is not None:
            x[:, :, 19] += 1.0  # the last token changes (additive mixes through the queries alone)
    moved = (attend(q2, k2, v2, s, w, causal=False) - attend(q, k, v, s, w, causal=False)).abs().amax(dim=(0, 1, 3))
    assert (moved > 1e-6).all(), moved  # the first token too


# --------------------------------------------------------------------------- the space layer


@pytest.mark.parametrize("spec", ENCODER_ONLY)
def test_causal_space_with_an_encoder_only_type_is_refused_naming_layer_and_type(spec):
    text = ENCODER.format(attention=f"softmax, '{spec}'").replace("task: masked-lm", "task: causal-lm")
    with pytest.raises(SpaceError) as info:
        parse_space(text, where="dec.yaml")
    assert info.value.errors == [f"dec.yaml: layers.attention[1]: {spec} has no causal form, which task causal-lm needs"]


def test_linformer_longer_than_the_sequences_is_refused():
    with pytest.raises(SpaceError) as info:
        parse_space(ENCODER.format(attention="'linformer:64'"), where="enc.yaml")
    assert info.value.errors == [
        "enc.yaml: layers.attention[0]: linformer:64: K=64 exceeds max_seq_len 48 (projecting to more rows than tokens)"
    ]


# --------------------------------------------------------------------------- models


@pytest.fixture(scope="module")
def encoder():
    types = ["softmax", "linformer:4", "linformer:8", "additive", "xca"]
    space = parse_space(ENCODER.format(attention=", ".join(f"'{a}'" for a in types)))
    return space, SuperTransformer(space, torch.Generator().manual_seed(0)).eval()


def test_linformer_projection_is_sliced_elastically(encoder):
    space, supernet = encoder
    e_full = supernet.blocks[0].attn.mix["linformer"].w["e"]
    assert tuple(e_full.shape) == (8, 48)  # (K_max, max_seq_len): shared by linformer:4 and linformer:8
    sub = Subnet(16, 1, (2,), (16,), ("linformer:4",))
    static = extract(supernet, sub)
    assert tuple(static.blocks[0].attn.mix["e"].shape) == (4, 48)
    torch.testing.assert_close(static.blocks[0].attn.mix["e"], e_full[:4].detach(), rtol=0, atol=0)
    # a layer of K=4 over T=20 tokens trains exactly the leading (4, 20) block of E
    supernet.zero_grad()
    idx = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(3))
    supernet(idx, sub).square().mean().backward()
    grad = e_full.grad
    assert grad[:4, :20].abs().min() > 0 and grad[4:].abs().sum() == 0 and grad[:, 20:].abs().sum() == 0
    supernet.zero_grad()
    # and the layer computes with that block: the same as a fresh E of exactly (4, 20)
    s, (q, k, v) = parse_attention("linformer:4"), qkv(parse_attention("linformer:4"), 20)
    w = {n: supernet.blocks[0].attn.mix["linformer"].w[n].detach() for n in ("e", "f")}
    exact = {n: t[:4, :20].clone() for n, t in w.items()}
    sliced = {n: t[:4] for n, t in w.items()}
    torch.testing.assert_close(attend(q, k, v, s, sliced, causal=False), attend(q, k, v, s, exact, causal=False), rtol=0, atol=0)


def test_encoder_models_with_each_type_extract_and_see_every_token(encoder):
    space, supernet = encoder
    rng = np.random.default_rng(0)
    subnets = [Subnet(24, 2, (4, 2), (32, 16), (a, a)) for a in ("linformer:4", "linformer:8", "additive", "xca")]
    subnets += [space.sample(rng) for _ in range(4)]
    idx = torch.randint(0, 64, (2, 37), generator=torch.Generator().manual_seed(1))
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 64
    with torch.no_grad():
        for sub in subnets:
            logits = supernet(idx, sub)
            static = extract(supernet, sub).eval()
            assert not static.config.causal
            assert (static(idx) - logits).abs().max().item() <= 1e-5, sub
            assert supernet.num_params(sub) == static.num_params()
            Transformer(TransformerConfig.from_subnet(space, sub)).load_state_dict(static.state_dict())
            assert (supernet(changed, sub)[:, 0] - logits[:, 0]).abs().max() > 1e-6, sub  # the first sees the last


@pytest.mark.parametrize("spec", ENCODER_ONLY)
def test_onnx_export_of_an_encoder_matches_onnx_runtime(tmp_path, spec):
    layers = (LayerChoice(2, 16, spec), LayerChoice(2, 16, "softmax"))
    config = TransformerConfig(64, 32, 8, "rope", 16, layers, causal=False)
    model = Transformer(config, generator=torch.Generator().manual_seed(0)).eval()
    path = export_onnx(model, tmp_path / "enc.onnx")
    fused = 2 if get(spec).fused_onnx else 1  # linformer: softmax over its projected keys
    assert op_counts(path)["Attention"] == fused
    g = torch.Generator().manual_seed(1)
    for shape in [(1, 5), (3, 19), (2, 32)]:  # dynamic batch and length, including the longest
        assert onnx_parity(path, model, torch.randint(0, 64, shape, generator=g)) <= 1e-4, shape


def test_the_encoder_attention_node_is_not_causal(tmp_path):
    import onnx

    config = TransformerConfig(64, 32, 8, "rope", 16, (LayerChoice(2, 16, "linformer:8"),), causal=False)
    path = export_onnx(Transformer(config, generator=torch.Generator().manual_seed(0)).eval(), tmp_path / "l.onnx")
    nodes = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Attention"]
    assert len(nodes) == 1 and all(a.i == 0 for a in nodes[0].attribute if a.name == "is_causal")


# --------------------------------------------------------------------------- cost


# B=2, H=4 heads of D=16, T=64 tokens, counted by hand (a multiply-add counts 2)
HAND_COSTS = {
    # E k and F v: (K x T) @ (T x D) each; q k'^T and p v': (T x D) @ (D x K) and (T x K) @ (K x D)
    "linformer:8": 2 * 4 * (2 * (2 * 8 * 64 * 16) + 2 * (2 * 64 * 8 * 16)),
    # per token: |q|, |v| (square, sum, divide: 3 D each), q.w_a (2 D), softmax (3), pooling (2 D), gate (D),
    # the (D x D) layer (2 D^2), + q (D)
    "additive": 2 * 4 * 64 * (3 * 16 + 3 * 16 + 2 * 16 + 3 + 2 * 16 + 16 + 2 * 16 * 16 + 16),
    # normalise q and k over the tokens (3 T D each), q^T k and v A^T (2 T D^2 each), temperature and softmax (4 D^2)
    "xca": 2 * 4 * (2 * 3 * 64 * 16 + 2 * 2 * 64 * 16 * 16 + 4 * 16 * 16),
}


@pytest.mark.parametrize("spec", list(HAND_COSTS))
def test_encoder_types_cost_what_a_hand_count_says(spec):
    from latency.features import mixing_flops
    from search_spaces import Workload

    assert mixing_flops(parse_attention(spec), Workload("p", 2, 64), 4, 16, causal=False) == HAND_COSTS[spec]
    assert get(spec).prefill_flops(parse_attention(spec), 2, 64, 4, 16) == HAND_COSTS[spec]  # its only form


def test_linformer_costs_far_less_than_softmax_at_4k():
    s, t = parse_attention("linformer:256"), 4096
    softmax = get("softmax").bidirectional_flops(parse_attention("softmax"), 1, t, 12, 64)
    ratio = softmax / get(s).bidirectional_flops(s, 1, t, 12, 64)
    assert math.isclose(ratio, 4 * t * t / (8 * 256 * t))  # T^2 pairs against 2 K T


# --------------------------------------------------------------------------- the benchmark


def test_bench_times_the_bidirectional_forms_and_prints_the_encoder_check(tmp_path, capsys):
    import csv

    from scripts.bench_attention import Row, encoder_check, main

    argv = ["--form", "bidirectional", "--types", "softmax,linformer:8,additive,xca", "--lengths", "24", "--heads", "2",
            "--head-dim", "8", "--reps", "1", "--threads", "1", "--out", str(tmp_path / "b")]  # fmt: skip
    assert main(argv) == 0
    rows = list(csv.DictReader((tmp_path / "b.csv").open()))
    assert {(r["scope"], r["mode"]) for r in rows} == {(s, m) for s in ("attention", "block") for m in ("fwd", "fwdbwd")}
    assert all(r["status"] == "ok" for r in rows) and len(rows) == 16
    # the encoder check: each target type against bidirectional softmax at 4k, forward
    cells = [Row("attention", "cpu", "fp32", kind, 4096, 1, 12, 64, "fwd", "ok", ms=ms)
             for kind, ms in (("softmax", 100.0), ("linformer:256", 8.0), ("xca", 12.5), ("additive", 10.0))]  # fmt: skip
    lines = encoder_check(cells)
    assert [line.split("->")[1].split()[0] for line in lines] == ["12.50x", "8.00x", "10.00x"]
    assert [line.endswith(v) for line, v in zip(lines, ("[PASS >= 10.0x]", "[FAIL >= 10.0x]", "[PASS >= 10.0x]"))] == [True] * 3
    with pytest.raises(SystemExit):
        main(["--form", "bidirectional", "--types", "convmod:3"])
    assert "--types: convmod:3 has no bidirectional form (--form bidirectional)" in capsys.readouterr().err


def test_nothing_decodes_an_encoder_with_encoder_only_types(tmp_path):
    from search_spaces import UserError
    from supernet import prefill
    from supernet.onnx_decode import export_decode_onnx

    config = TransformerConfig(64, 32, 8, "rope", 16, tuple(LayerChoice(2, 16, a) for a in ENCODER_ONLY), causal=False)
    model = Transformer(config, generator=torch.Generator().manual_seed(0)).eval()
    encoder = "bidirectional encoder \\(task masked-lm or sequence-classification\\)"
    with pytest.raises(UserError, match=encoder + ": it has no decoding cache"):
        prefill(model, torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(UserError, match=encoder + ": it has no decode step to export"):
        export_decode_onnx(model, tmp_path / "d.onnx")
    assert not (tmp_path / "d.onnx").exists()

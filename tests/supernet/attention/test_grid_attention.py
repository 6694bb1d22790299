"""The 2D attention types over a square token grid (issue 40): ``swin:W``, ``swin-shift:W``, ``axial``, ``convmod2d:K``,
``msla2d:K``.  Each fast path and ONNX form equals its float64 reference (forward and gradients, the type's own
weights included) on 4 x 4, 7 x 7 and 14 x 14 grids; the shifted windows are Swin's (its cyclic shift and mask,
rebuilt here from its code) and no token sees across a window's border; a length that is not a square, a window
that does not divide the side and a space that cannot hold them are refused naming the values; encoder models
with them extract, slice their kernels elastically and export to ONNX (a dynamic grid side) exactly; and they
cost a hand count."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from search_spaces import LayerChoice, SpaceError, Subnet, Workload, parse_space
from search_spaces.attention import parse_attention
from supernet import SuperTransformer, Transformer, TransformerConfig, extract
from supernet.attention import attend, attend_reference, get
from supernet.attention.conv import centred_offset
from supernet.attention.grid import conv2d_reference, dwconv2d, grid_side
from supernet.attention.swin import window_mask
from supernet.onnx_export import export_onnx, onnx_parity, op_counts

from tests.supernet.attention.test_attention_types import mix, qkv
from tests.supernet.test_bidirectional import ENCODER
from tests.supernet.test_train import one_thread  # noqa: F401  (autouse)

GRID_TYPES = ["swin:2", "swin-shift:2", "axial", "convmod2d:3", "msla2d:3"]
# per grid side, the spellings that fit it (windows that divide the side; kernels up to the side)
CASES = {
    4: ["swin:2", "swin:4", "swin-shift:2", "swin-shift:4", "axial", "convmod2d:2", "convmod2d:3", "msla2d:4"],
    7: ["swin:7", "swin-shift:7", "axial", "convmod2d:5", "msla2d:3"],
    14: ["swin:2", "swin:7", "swin-shift:2", "swin-shift:7", "axial", "convmod2d:4", "convmod2d:7", "msla2d:5"],
}
SQUARE = ENCODER.replace("max_seq_len: 48", "max_seq_len: 64").replace("seq_len: 48", "seq_len: 64")


def test_types_are_registered_grid_encoder_types():
    families = {"swin:3": "dot-product", "swin-shift:3": "dot-product", "axial": "dot-product", "convmod2d:3": "gating",
                "msla2d:3": "kernel-feature"}  # fmt: skip
    for spec, family in families.items():
        typ = get(spec)
        assert typ.forms == ("bidirectional",) and typ.family == family and typ.doc, spec
    assert get("swin:7") is not get("swin-shift:7") and type(get("swin:7")) is type(get("swin-shift:7"))
    assert parse_attention("swin-shift:7").param("W") == 7 and parse_attention("msla2d:5").param("K") == 5
    with pytest.raises(ValueError, match="'swin' must be written swin:W"):
        parse_attention("swin")


def _float64_reference(spec, q, k, v, w):
    """The reference in float64 from the same (fp32) leaves, so its gradients reach them."""
    dbl = [None if x is None else x.double() for x in (q, k, v)]
    return attend_reference(*dbl, spec, {n: x.double() for n, x in w.items()}, causal=False)


@pytest.mark.parametrize("side", list(CASES))
def test_fast_path_and_onnx_form_equal_the_float64_reference(side):
    t = side * side
    for text in CASES[side]:
        s = parse_attention(text)
        typ = get(s)
        assert type(typ).bidirectional is not type(typ).bidirectional_reference, text  # a fast path of its own
        q, k, v = qkv(s, t, seed=side, requires_grad=True)
        w = mix(s, requires_grad=True)
        inputs = [x for x in (q, k, v, *w.values()) if x is not None]
        ref = _float64_reference(s, q, k, v, w)
        grad_out = torch.randn(ref.shape, generator=torch.Generator().manual_seed(99), dtype=torch.float64)
        want = torch.autograd.grad(ref, inputs, grad_out)
        scale = max(1.0, ref.abs().max().item())
        for name, path in (("fast", typ.bidirectional), ("onnx", typ.bidirectional_onnx)):
            out = path(q, k, v, s, w)
            assert out.dtype == torch.float32 and out.shape == q.shape, (text, name)
            assert (out.double() - ref).abs().max().item() <= 1e-5 * scale, (text, side, name)
            got = torch.autograd.grad(out, inputs, grad_out.float())
            for g, g_ref in zip(got, want):
                assert (g.double() - g_ref).abs().max().item() <= 1e-4 * max(1.0, g_ref.abs().max().item()), (text, side, name)
        fast = attend(q, k, v, s, w, causal=False)  # the registry's dispatch reaches the fast path
        assert torch.equal(fast, typ.bidirectional(q, k, v, s, w)), text


def test_a_length_that_is_not_a_square_is_refused_with_the_value():
    for text in GRID_TYPES:
        s = parse_attention(text)
        q, k, v = qkv(s, 15)
        w = mix(s)
        for path in (attend, attend_reference):
            with pytest.raises(ValueError, match="T=15 is not a square"):
                path(q, k, v, s, w, causal=False)
    with pytest.raises(ValueError, match=r"swin-shift:3: the window W=3 does not divide the grid side S=4 of T=16 tokens"):
        attend(*qkv(parse_attention("swin-shift:3"), 16), parse_attention("swin-shift:3"), {}, causal=False)
    assert grid_side(196) == 14


# --------------------------------------------------------------------------- Swin's windows


def swin_mask(side: int, window: int, shift: int) -> torch.Tensor:
    """(T, T) from Swin's code (``SwinTransformerBlock.calculate_mask`` with its cyclic shift), in the original frame.

    Swin labels the regions of the shifted image, partitions it into windows and masks pairs of different labels;
    a pair of the rolled grid is a pair of the original one rolled back."""
    img = torch.zeros(side, side)
    cnt = 0
    slices = (slice(0, -window), slice(-window, -shift), slice(-shift, None)) if shift else (slice(0, None),)
    for h in slices:
        for w in slices:
            img[h, w] = cnt
            cnt += 1
    n = side // window
    wins = img.view(n, window, n, window).permute(0, 2, 1, 3).reshape(-1, window * window)  # window_partition
    allowed_rolled = wins[:, :, None] == wins[:, None, :]  # (nW, L, L)
    # token of the rolled grid at (r', c') holds the original token ((r' + shift) % S, (c' + shift) % S)
    r = torch.arange(side)
    src = (r + shift) % side
    tokens = (src.view(n, window)[:, None, :, None] * side + src.view(n, window)[None, :, None, :]).reshape(n * n, -1)
    out = torch.zeros(side * side, side * side, dtype=torch.bool)
    for win in range(n * n):
        out[tokens[win][:, None], tokens[win][None, :]] = allowed_rolled[win]
    return out


@pytest.mark.parametrize("side,window", [(4, 2), (8, 4), (12, 4), (12, 6), (7, 7)])
def test_the_window_masks_are_swins(side, window):
    for shift in (0, window // 2):
        ours = window_mask(side, window, shift)
        assert torch.equal(ours, swin_mask(side, window, shift)), (side, window, shift)
        assert torch.equal(ours, ours.T) and ours.diagonal().all()
        assert ours.sum(-1).max() <= window * window  # no token sees more than a window
        assert (ours.sum(-1) == window * window).all() or shift  # unshifted: every window whole
    if window < side:  # the shifted partition is another one: a border crossed by the unshifted windows
        assert not torch.equal(window_mask(side, window, 0), window_mask(side, window, window // 2))


@pytest.mark.parametrize("spec,side", [("swin:2", 4), ("swin-shift:2", 4), ("swin-shift:4", 8), ("swin-shift:3", 9),
                                       ("swin:3", 9), ("swin-shift:7", 7)])  # fmt: skip
def test_no_token_attends_across_a_window_border(spec, side):
    """One-hot values (v[j] = e_j) make the output the attention weights: out[i, j] = weight of key j for query i."""
    s, t = parse_attention(spec), side * side
    q, k, _ = qkv(s, t, b=1, h=2, d=t, seed=3)
    v = torch.eye(t).expand(1, 2, t, t)
    typ = get(s)
    shift = typ.geometry(s, t)[2]
    allowed = swin_mask(side, s.param("W"), shift)
    for path in (typ.bidirectional, typ.bidirectional_onnx, typ.bidirectional_reference):
        weights = path(q, k, v, s, {})[0]  # (H, T, T)
        assert (weights[:, ~allowed] == 0).all(), spec  # nothing from across a border (exactly: -inf before the softmax)
        assert (weights[:, allowed] > 0).all(), spec  # every token of its window
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, t))


# --------------------------------------------------------------------------- axial


def test_axial_reference_is_rows_then_columns_on_the_row_output():
    s = parse_attention("axial")
    side, t = 3, 9
    q, k, v = qkv(s, t, b=1, h=2, d=4)
    out = torch.empty_like(q)
    at = lambda r, c: r * side + c  # noqa: E731  row-major
    for h in range(2):
        rows = torch.empty(t, 4)
        for r in range(side):
            for c in range(side):
                keys = [at(r, j) for j in range(side)]
                p = torch.stack([(q[0, h, at(r, c)] * k[0, h, j]).sum() / 2.0 for j in keys]).softmax(0)  # sqrt(D) = 2
                rows[at(r, c)] = sum(p_ * v[0, h, j] for p_, j in zip(p, keys))
        for r in range(side):
            for c in range(side):
                keys = [at(i, c) for i in range(side)]
                p = torch.stack([(q[0, h, at(r, c)] * k[0, h, j]).sum() / 2.0 for j in keys]).softmax(0)
                out[0, h, at(r, c)] = sum(p_ * rows[j] for p_, j in zip(p, keys))
    torch.testing.assert_close(attend_reference(q, k, v, s, causal=False), out)
    # one layer reaches every token: through the token at the query's column and the key's row
    eye = torch.eye(16).expand(1, 2, 16, 16)
    q, k, _ = qkv(s, 16, b=1, h=2, d=16)
    assert (attend(q, k, eye, s, causal=False) > 0).all()


# --------------------------------------------------------------------------- the 2D convolution


def test_the_2d_convolution_taps_are_nearest_first_on_each_axis():
    x = torch.randn(1, 2, 25, 3, generator=torch.Generator().manual_seed(0))  # a 5 x 5 grid
    grid = x.view(1, 2, 5, 5, 3)
    for a in range(4):
        for b in range(4):
            w = torch.zeros(6, 4, 4)
            w[:, a, b] = 1.0  # one tap: the grid moved by its offsets, zeros from outside
            oa, ob = centred_offset(a), centred_offset(b)
            want = torch.zeros_like(grid)
            for r in range(5):
                for c in range(5):
                    if 0 <= r + oa < 5 and 0 <= c + ob < 5:
                        want[:, :, r, c] = grid[:, :, r + oa, c + ob]
            torch.testing.assert_close(conv2d_reference(x, w), want.view(1, 2, 25, 3))
            torch.testing.assert_close(dwconv2d(x, w), want.view(1, 2, 25, 3))
    w = torch.randn(6, 7, 7, generator=torch.Generator().manual_seed(1))
    for k in (2, 3, 6, 7):  # an elastic kernel's leading block is the centred k x k one
        torch.testing.assert_close(dwconv2d(x, w[:, :k, :k]), conv2d_reference(x, w[:, :k, :k]))
    centre = torch.zeros(6, 1, 3, 3)  # msla2d:3 in torch's own layout: offsets -1, 0, +1 on each axis
    order = [1, 0, 2]  # offset -1 is tap 1, 0 tap 0, +1 tap 2
    centre[:, 0] = w[:, order][:, :, order][:, :3, :3]
    chans = grid.permute(0, 1, 4, 2, 3).reshape(1, 6, 5, 5)
    want = F.conv2d(chans, centre, padding=1, groups=6).view(1, 2, 3, 5, 5).permute(0, 1, 3, 4, 2).reshape(1, 2, 25, 3)
    torch.testing.assert_close(conv2d_reference(x, w[:, :3, :3]), want)


# --------------------------------------------------------------------------- the space layer


def test_spaces_that_cannot_hold_a_grid_type_are_refused_naming_the_values():
    with pytest.raises(SpaceError) as info:
        parse_space(ENCODER.format(attention="'swin:4', axial"), where="enc.yaml")
    assert info.value.errors == [
        "enc.yaml: layers.attention[0]: swin:4: max_seq_len 48 is not a square grid (a 2D type needs T = S * S tokens: "
        "an image's patches)",
        "enc.yaml: layers.attention[1]: axial: max_seq_len 48 is not a square grid (a 2D type needs T = S * S tokens: "
        "an image's patches)",
    ]
    with pytest.raises(SpaceError) as info:
        parse_space(SQUARE.format(attention="'swin:3', 'swin-shift:1', 'convmod2d:9', 'msla2d:1'"), where="enc.yaml")
    assert info.value.errors == [
        "enc.yaml: layers.attention[0]: swin:3: the window W=3 does not divide the grid side 8 of max_seq_len 64",
        "enc.yaml: layers.attention[1]: swin-shift:1: W must be at least 2 (a 1 x 1 window sees only its own token)",
        "enc.yaml: layers.attention[2]: convmod2d:9: K=9 exceeds the grid side 8 of max_seq_len 64",
        "enc.yaml: layers.attention[3]: msla2d:1: K must be at least 2 (one tap is a per-channel scale, not a convolution)",
    ]
    with pytest.raises(SpaceError, match=r"swin:4 has no causal form, which task causal-lm needs"):
        parse_space(SQUARE.format(attention="'swin:4'").replace("masked-lm", "causal-lm"), where="dec.yaml")
    assert parse_space(SQUARE.format(attention="'swin:4', 'swin-shift:8', axial, 'convmod2d:8', 'msla2d:3'")).attention


# --------------------------------------------------------------------------- models


MODEL_TYPES = ["softmax", "swin:2", "swin-shift:4", "axial", "convmod2d:3", "convmod2d:5", "msla2d:2", "msla2d:4", "xca"]


@pytest.fixture(scope="module")
def encoder():
    space = parse_space(SQUARE.format(attention=", ".join(f"'{a}'" for a in MODEL_TYPES)))
    return space, SuperTransformer(space, torch.Generator().manual_seed(0)).eval()


def test_encoder_models_extract_and_slice_the_kernels_elastically(encoder):
    space, supernet = encoder
    dw = supernet.blocks[0].attn.mix["convmod2d"].w["dw"]
    assert tuple(dw.shape) == (4 * 8, 5, 5)  # the largest over the space: 4 heads of 8, K = 5
    subnets = [Subnet(24, 2, (4, 2), (32, 16), ("swin:2", "swin-shift:4")),
               Subnet(16, 2, (2, 4), (16, 32), ("axial", "xca")),
               Subnet(24, 1, (2,), (16,), ("convmod2d:3",)),
               Subnet(16, 2, (4, 4), (16, 16), ("msla2d:2", "msla2d:4"))]  # fmt: skip
    subnets += [space.sample(np.random.default_rng(i)) for i in range(3)]
    grids = [torch.randint(0, 64, (2, n), generator=torch.Generator().manual_seed(n)) for n in (64, 16)]  # 8 x 8, 4 x 4
    with torch.no_grad():
        for sub in subnets:
            static = extract(supernet, sub).eval()
            assert supernet.num_params(sub) == static.num_params()
            Transformer(TransformerConfig.from_subnet(space, sub)).load_state_dict(static.state_dict())
            for idx in grids:
                assert (static(idx) - supernet(idx, sub)).abs().max().item() <= 1e-5, sub
    # a convmod2d:3 layer uses (and trains) the centred 3 x 3 block of the 5 x 5 kernel: its leading slice
    sub = Subnet(16, 1, (2,), (16,), ("convmod2d:3",))
    torch.testing.assert_close(extract(supernet, sub).blocks[0].attn.mix["dw"], dw[:16, :3, :3].detach(), rtol=0, atol=0)
    supernet.zero_grad()
    supernet.train()
    supernet(grids[0], sub).square().mean().backward()
    supernet.eval()
    assert dw.grad[:16, :3, :3].abs().min() > 0 and dw.grad[16:].abs().sum() == 0 and dw.grad[:, 3:].abs().sum() == 0
    assert dw.grad[:, :, 3:].abs().sum() == 0
    supernet.zero_grad()


def test_onnx_export_serves_every_grid_side(tmp_path):
    layers = tuple(LayerChoice(2, 16, a) for a in ["swin:2", "swin-shift:2", "axial", "msla2d:2"])  # convmod2d: below
    config = TransformerConfig(64, 64, 8, "learned", 16, layers, causal=False)
    model = Transformer(config, generator=torch.Generator().manual_seed(0)).eval()
    with torch.no_grad():  # the kernels away from their near-identity start, so a wrong tap shows
        for block in model.blocks:
            for p in block.attn.mix.values():
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(2))
    path = export_onnx(model, tmp_path / "grid.onnx")
    counts = op_counts(path)
    assert counts["Attention"] == 4 and "Conv" not in counts  # swin, swin-shift, axial's rows and columns
    g = torch.Generator().manual_seed(1)
    for shape in [(1, 4), (3, 16), (2, 36), (2, 64)]:  # grid sides 2, 4, 6, 8 from one graph
        assert onnx_parity(path, model, torch.randint(0, 64, shape, generator=g)) <= 1e-4, shape


# --------------------------------------------------------------------------- cost


# B=2, H=4 heads of D=16, T=64 tokens (8 x 8), counted by hand (a multiply-add counts 2)
HAND_COSTS = {
    "swin:4": 4 * 2 * 4 * 64 * 16 * 16,  # 16 keys per query (its 4 x 4 window), 4 D FLOPs a pair
    "swin-shift:4": 4 * 2 * 4 * 64 * 16 * 16,  # the windows of the rolled grid: 16 keys computed, some masked
    "axial": 4 * 2 * 4 * 64 * (8 + 8) * 16,  # 8 keys along the row, then 8 along the column
    "convmod2d:3": 2 * 2 * 64 * 64 * 9 + 2 * 64 * 64,  # 9 taps per channel (H D = 64) and token, the gate
    "msla2d:3": 2 * (2 * 2 * 4 * 64 * 16 * 33) + 3 * 2 * 2 * 64 * 64 * 9,  # two relu-linear (k^T v, q s, den) + 3 convs
}


@pytest.mark.parametrize("spec", list(HAND_COSTS))
def test_grid_types_cost_what_a_hand_count_says(spec):
    from latency.features import flops, mixing_flops

    assert mixing_flops(parse_attention(spec), Workload("p", 2, 64), 4, 16, causal=False) == HAND_COSTS[spec]
    assert get(spec).prefill_flops(parse_attention(spec), 2, 64, 4, 16) == HAND_COSTS[spec]  # its only form
    space = parse_space(SQUARE.format(attention=f"'{spec}', softmax"))
    sub = Subnet(16, 1, (2,), (16,), (spec,))
    softmax = flops(space, Subnet(16, 1, (2,), (16,), ("softmax",)), space.workload("prefill"))
    assert flops(space, sub, space.workload("prefill")) < softmax  # the model's cost reads the type's


def test_window_types_cost_less_than_softmax_by_the_pair_ratio():
    t, s = 784, parse_attention("swin:7")
    softmax = get("softmax").bidirectional_flops(parse_attention("softmax"), 1, t, 4, 32)
    assert math.isclose(softmax / get(s).bidirectional_flops(s, 1, t, 4, 32), t / 49)
    assert math.isclose(softmax / get("axial").bidirectional_flops(parse_attention("axial"), 1, t, 4, 32), t / 56)


# --------------------------------------------------------------------------- the benchmark


def test_bench_quick_times_every_type_and_prints_the_target(tmp_path, capsys):
    import json

    from scripts.bench_attention_2d import main, targets

    assert main(["--quick", "--out", str(tmp_path / "b")]) == 0
    meta = json.loads((tmp_path / "b.json").read_text())
    assert meta["tokens"] == 16 and meta["grid"] == 4 and meta["threads"] == 1
    rows = {r["type"]: r for r in meta["rows"]}
    assert list(rows) == ["softmax", "swin:2", "swin-shift:2", "axial", "convmod2d:3", "msla2d:3"]
    assert all(len(r["times_ms"]) == 2 and r["ms"] > 0 for r in rows.values())
    assert rows["swin:2"]["flops"] == 4 * 2 * 16 * 4 * 8  # B=1, 2 heads of 8, 16 tokens, 4 keys each
    assert "target: swin:2 forward" in capsys.readouterr().out
    lines = targets({"softmax": 10.0, "swin:7": 2.0, "axial": 4.0, "convmod2d:7": 1.0}, 56, 2)
    assert lines == ["target: swin:7 forward 5.00x faster than softmax [PASS >= 4x]",
                     "target: axial forward 2.50x faster than softmax [FAIL >= 4x]"]  # fmt: skip
    with pytest.raises(SystemExit):
        main(["--types", "softmax,swin:5", "--out", str(tmp_path / "c")])
    assert "swin:5: the window W=5 does not divide the grid side 28 of max_seq_len 784 (grid 28 x 28" in capsys.readouterr().err


def test_stitched_timing_graphs_compute_them(tmp_path):
    """The latency tables' shape-generic ONNX parts: a 2D type's block is traced on the whole grid (its
    trace_length: one token less is not a square) and serves every grid side and head count."""
    from latency.onnx_graphs import cached_graph, with_weights
    from supernet.onnx_export import onnx_session

    for heads in (2, 4):
        layers = (LayerChoice(heads, 16, "swin-shift:2"), LayerChoice(2, 16, "convmod2d:2"))
        config = TransformerConfig(64, 64, 8, "learned", 16, layers, causal=False)
        model = Transformer(config, generator=torch.Generator().manual_seed(heads)).eval()
        graph, tensors = cached_graph(model, tmp_path)
        session = onnx_session(with_weights(graph, tensors, model, tmp_path / f"own{heads}"), threads=1)
        for shape in [(2, 64), (1, 16)]:
            x = torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(3))
            with torch.no_grad():
                assert np.abs(session.run(None, {"input_ids": x.numpy()})[0] - model(x).numpy()).max() <= 1e-4, (heads, shape)
    parts = [p.read_text() for p in (tmp_path / "generic").glob("*.json")]
    assert sum('"swin-shift:2"' in p for p in parts) == 1  # one part for 2 and 4 heads

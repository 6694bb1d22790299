"""The redesign's proof: an attention type defined in this file alone works everywhere.

``GatedDecay`` is declared here and nowhere else: a causal exponential moving average of the values,
gated by the queries, with a weight of its own and no keys (``y_i = sigmoid(q_i) * scale *
sum_{j<=i} (1 - a) a^(i-j) v_j``, ``a = 1 - 1/K``).  Registering it is the only step; then the
space layer accepts its spelling, the supernet trains it with an elastic weight, extraction and
decoding match, the latency features cost it, the stitched ONNX timing graphs (prefill and
decode step) compute it, and the ONNX exports match torch.
"""

import numpy as np
import pytest
import torch

from search_spaces import LayerChoice, SpaceError, Subnet, Workload, parse_space
from supernet import SuperTransformer, Transformer, TransformerConfig, decode_step, extract, prefill
from supernet.attention import AttentionType, StateSpec, register, unregister
from supernet.onnx_export import export_onnx, onnx_parity, onnx_session
from tests.supernet.test_decode import one_thread  # noqa: F401  (autouse)


class GatedDecay(AttentionType):
    name = "test-decay"
    params = ("K",)
    doc = "(test) queries gate a causal moving average of the values with decay 1 - 1/K"

    def problems(self, spec, max_seq_len, heads):
        return [f"K={spec.param('K')} is longer than max_seq_len {max_seq_len}"] if spec.param("K") > max_seq_len else []

    def heads(self, spec, heads):
        return 0, heads  # no keys

    def weights(self, spec, heads, head_dim, max_seq_len=None):
        return {"scale": (heads * head_dim,)}

    def init_weight(self, name, weight, generator):
        torch.nn.init.ones_(weight)

    def _decay(self, spec):
        return 1.0 - 1.0 / spec.param("K")

    def reference(self, q, k, v, spec, w):
        a, t = self._decay(spec), q.shape[2]
        i = torch.arange(t, device=q.device)
        d = (i[:, None] - i[None, :]).to(q.dtype)  # (T, T) distances
        m = torch.where(d >= 0, (1 - a) * a ** d.clamp(min=0), torch.zeros_like(d))  # causal decay weights
        scale = w["scale"].view(1, q.shape[1], 1, q.shape[3])
        return torch.sigmoid(q) * scale * (m @ v)  # (B, H, T, D)

    def state(self, spec, heads, head_dim):
        return {"s": StateSpec((heads, head_dim), fp32=True)}

    def prefill_state(self, spec, q, k, v, w, capacity):
        a, t = self._decay(spec), v.shape[2]
        weights = (1 - a) * a ** torch.arange(t - 1, -1, -1, dtype=torch.float32, device=v.device)  # (T,)
        return {"s": (v.float() * weights[:, None]).sum(2)}  # (B, H, D)

    def step(self, spec, state, q, k, v, w, pos, length):
        a = self._decay(spec)
        s = a * state["s"] + (1 - a) * v[:, :, 0].float()  # (B, H, D)
        scale = w["scale"].view(1, q.shape[1], 1, q.shape[3])
        return torch.sigmoid(q) * scale * s[:, :, None].to(v.dtype), {"s": s}

    def prefill_flops(self, spec, batch, t, heads, head_dim):
        return 5.0 * batch * heads * t * head_dim  # decay update (2), gate (2), scale (1)

    def decode_flops(self, spec, batch, context, heads, head_dim):
        return 5.0 * batch * heads * head_dim


SPACE = """
task: causal-lm
vocab_size: 64
max_seq_len: 48
head_dim: 8
positions: {positions}
embed_dim: [16, 24]
depth: [1, 2]
layers: {{heads: [1, 2, 3], ffn_dim: [16, 32], attention: [softmax, "test-decay:4", "test-decay:16"]}}
latency: {{prefill: {{batch_size: 1, seq_len: 48}}, decode: {{batch_size: 1, context: 20}}}}
"""


@pytest.fixture(scope="module")
def decay():
    typ = register(GatedDecay())
    yield typ
    unregister(typ.name)


def space(positions="rope"):
    return parse_space(SPACE.format(positions=positions), where="decay.yaml")


def supernet(positions="rope"):
    model = SuperTransformer(space(positions), generator=torch.Generator().manual_seed(0)).eval()
    with torch.no_grad():  # the elastic weight away from its initial ones, so slicing mistakes show
        for layer in model.blocks:
            layer.attn.mix["test-decay"].w["scale"].normal_(1.0, 0.5, generator=torch.Generator().manual_seed(1))
    return model


def subnets():  # (after the type is registered: a subnet checks its spellings)
    return [
        Subnet(24, 2, (3, 2), (32, 16), ("test-decay:4", "softmax")),
        Subnet(16, 2, (1, 3), (16, 32), ("test-decay:16", "test-decay:4")),
        Subnet(24, 1, (2,), (32,), ("test-decay:16",)),
    ]


def test_the_space_layer_accepts_the_spelling_and_its_problems(decay):
    assert space().attention == ("softmax", "test-decay:4", "test-decay:16")
    with pytest.raises(SpaceError, match=r"layers.attention\[1\]: K=64 is longer than max_seq_len 48"):
        parse_space(SPACE.format(positions="rope").replace("test-decay:4", "test-decay:64"), where="decay.yaml")


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_supernet_extraction_and_decoding(decay, positions):
    model = supernet(positions)
    x = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(2))
    mix = model.blocks[0].attn.mix["test-decay"].w["scale"]
    assert mix.shape == (3 * 8,)  # the largest over the space: 3 heads x head_dim
    for subnet in subnets():
        static = extract(model, subnet).eval()
        assert model.num_params(subnet) == static.num_params()
        assert [b.attn.k is None for b in static.blocks] == [a.startswith("test-decay") for a in subnet.attention]
        with torch.no_grad():
            full = model(x, subnet)
            assert (static(x) - full).abs().max().item() <= 1e-5, subnet
            logits, cache = prefill(static, x[:, :15])
            steps = [logits] + [decode_step(static, x[:, t : t + 1], cache)[0] for t in range(15, 40)]
        assert (torch.cat(steps, 1) - full).abs().max().item() <= 1e-4, subnet
    # the type's weight trains through its leading slice only
    model.train()
    model(x, subnets()[1]).sum().backward()
    g = model.blocks[1].attn.mix["test-decay"].w["scale"].grad
    assert g[:24].abs().sum() > 0 and g[24:].abs().sum() == 0


def test_latency_features_cost_it(decay):
    from latency.features import additive_terms, cache_bytes, flops

    sp = space()
    prefill_w, decode_w = sp.workload("prefill"), sp.workload("decode")
    one = Subnet(16, 1, (2,), (32,), ("test-decay:4",))
    e, a, f, t, v = 16, 2 * 8, 32, 48, 64
    hand = 2 * t * e * v + 2 * t * e * (a + a + a) + 2 * t * 2 * e * f + 5 * t * a  # head; q, v, o (no k); MLP; mixing
    assert flops(sp, one, prefill_w) == hand
    assert cache_bytes(sp, one, decode_w) == 4 * 2 * 8  # the running sum: heads x head_dim fp32
    assert flops(sp, one, decode_w) == hand / t  # one token, whose mixing does not grow with the context
    terms = additive_terms(sp, one, prefill_w)
    assert terms["layer[test-decay:4]:count"] == 1 and terms["layer[test-decay:4]:mix"] > 0
    assert flops(sp, one, Workload("long", 1, 0, "decode", 4000)) == flops(sp, one, decode_w)


def test_stitched_timing_graphs_compute_it(decay, tmp_path):
    from latency.onnx_graphs import cached_decode_graph, cached_graph, with_weights
    from supernet.onnx_decode import onnx_decode_logits

    model = supernet()
    for subnet in subnets()[:2]:
        static = extract(model, subnet).eval()
        graph, tensors = cached_graph(static, tmp_path)
        session = onnx_session(with_weights(graph, tensors, static, tmp_path / "own"), threads=1)
        x = torch.randint(0, 64, (2, 33), generator=torch.Generator().manual_seed(3))
        out = session.run(None, {"input_ids": x.numpy()})[0]
        assert np.abs(out - static(x).detach().numpy()).max() <= 1e-4, subnet
        graph, tensors, _ = cached_decode_graph(static, tmp_path)
        session = onnx_session(with_weights(graph, tensors, static, tmp_path / "own-step"), threads=1)
        with torch.no_grad():
            full = static(x[:, :20]).numpy()
        assert np.abs(onnx_decode_logits(session, x[:, :20].numpy()) - full).max() <= 1e-4, subnet
    # one generic part per (type, part) serves every head count: 1 and 3 heads above, one export
    parts = [p.read_text() for p in (tmp_path / "generic").glob("*.json")]
    assert sum('"test-decay:4"' in p and '"block"' in p for p in parts) == 1


def test_onnx_exports_match_torch(decay, tmp_path):
    from supernet.onnx_decode import export_decode_onnx, onnx_decode_logits

    static = extract(supernet(), subnets()[1]).eval()
    path = export_onnx(static, tmp_path / "model.onnx")
    x = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(4))
    assert onnx_parity(path, static, x) <= 1e-4
    session = onnx_session(export_decode_onnx(static, tmp_path / "step.onnx"), threads=1)
    with torch.no_grad():
        assert np.abs(onnx_decode_logits(session, x.numpy()) - static(x).numpy()).max() <= 1e-4
    fresh = Transformer(TransformerConfig.from_subnet(space(), subnets()[1]))  # a from-scratch model has the same shapes
    fresh.load_state_dict(static.state_dict())
    assert [n for n in static.state_dict() if "mix" in n] == ["blocks.0.attn.mix.scale", "blocks.1.attn.mix.scale"]
    assert LayerChoice(1, 16, "test-decay:16").attention_spec.param("K") == 16

import numpy as np
import pytest
import torch

from search_spaces import Subnet, SubnetError, UserError, parse_attention, parse_space, types
from supernet import SuperTransformer, Transformer, TransformerConfig, extract
from supernet.attention import REGISTRY, attend

TOL = 1e-5


@pytest.fixture(scope="module")
def supernet(tiny):
    return SuperTransformer(tiny, generator=torch.Generator().manual_seed(0)).eval()


@pytest.fixture(scope="module")
def learned_space(tiny):
    text = (
        "task: causal-lm\nvocab_size: 256\nmax_seq_len: 64\nhead_dim: 16\npositions: learned\n"
        "embed_dim: [32, 48]\ndepth: [1, 2, 3]\n"
        "layers: {heads: [1, 3], ffn_dim: [32, 96], attention: [softmax, 'local:8', linear]}\n"
        "latency: {prefill: {batch_size: 1, seq_len: 64}}\n"
    )
    return parse_space(text, where="learned.yaml")


def random_subnets(space, n, seed):
    rng = np.random.default_rng(seed)
    return [space.sample(rng) for _ in range(n)]


def max_diff(model_a, model_b_fn, x):
    with torch.no_grad():
        return (model_a(x) - model_b_fn(x)).abs().max().item()


def test_registry_matches_grammar():
    assert set(REGISTRY) == set(types()) >= {"softmax", "local", "linear"}


def test_extraction_parity(tiny, supernet):
    x = torch.randint(0, tiny.vocab_size, (2, tiny.max_seq_len), generator=torch.Generator().manual_seed(1))
    subnets = [tiny.largest(), tiny.smallest()] + random_subnets(tiny, 60, seed=0)
    seen_types = set()
    worst = 0.0
    for subnet in subnets:
        static = extract(supernet, subnet).eval()
        worst = max(worst, max_diff(static, lambda t: supernet(t, subnet), x))
        seen_types |= set(subnet.attention)
    assert seen_types == set(tiny.attention)
    assert worst <= TOL, worst


def test_extraction_parity_learned_positions(learned_space):
    model = SuperTransformer(learned_space, generator=torch.Generator().manual_seed(0)).eval()
    x = torch.randint(0, 256, (3, 50))
    for subnet in [learned_space.largest(), learned_space.smallest()] + random_subnets(learned_space, 20, seed=4):
        assert max_diff(extract(model, subnet).eval(), lambda t: model(t, subnet), x) <= TOL


def test_extracted_model_is_the_plain_static_class(tiny, supernet):
    subnet = random_subnets(tiny, 1, seed=5)[0]
    static = extract(supernet, subnet)
    assert type(static) is Transformer
    assert static.config == TransformerConfig.from_subnet(tiny, subnet)
    assert static.subnet == subnet
    fresh = Transformer(TransformerConfig.from_subnet(tiny, subnet))  # a from-scratch model of that shape
    fresh.load_state_dict(static.state_dict())  # same keys and shapes, strict
    assert not any("elastic" in type(m).__name__.lower() for m in static.modules())


def test_extraction_shares_no_storage(tiny):
    model = SuperTransformer(tiny, generator=torch.Generator().manual_seed(0))
    subnet = tiny.smallest()
    static = extract(model, subnet)
    super_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert not super_ptrs & {p.untyped_storage().data_ptr() for p in static.parameters()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in static.parameters():
            p.add_(1.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_parameter_counts_are_exact(tiny, supernet, learned_space):
    for subnet in [tiny.largest(), tiny.smallest()] + random_subnets(tiny, 30, seed=6):
        static = extract(supernet, subnet)
        assert supernet.num_params(subnet) == static.num_params() == sum(p.numel() for p in static.parameters())
    model = SuperTransformer(learned_space)
    for subnet in random_subnets(learned_space, 10, seed=7):
        assert model.num_params(subnet) == extract(model, subnet).num_params()
    # the largest subnet uses every parameter of the supernet
    mix = sum(p.numel() for n, p in supernet.named_parameters() if ".mix." in n)  # the types' own weights, at their largest
    # lsra:7 (2 conv heads), msla:5 (q, k, v), convmod:7
    assert mix == tiny.max_depth * (2 * 32 * 7 + 3 * 4 * 32 * 5 + 4 * 32 * 7)
    assert supernet.num_params(tiny.largest()) + mix == sum(p.numel() for p in supernet.parameters())


def test_no_state_leaks_between_calls(tiny, supernet):
    a, b = random_subnets(tiny, 2, seed=8)
    x = torch.randint(0, tiny.vocab_size, (1, 40))
    with torch.no_grad():
        first = supernet(x, a)
        supernet(x, b)
        supernet(x, tiny.largest())
        again = supernet(x, a)
    assert torch.equal(first, again)


def test_a_subnet_parses_its_attention_once_and_nothing_downstream_parses_it_again(tiny, supernet, monkeypatch):
    """The spellings are parsed where the subnet is built (issue 52): the supernet's forward, the extraction, the
    static model's forward and the cost features read the parsed specs, never the strings again."""
    import sys

    from latency.features import additive_terms, flops, layered_terms

    calls, original = [], parse_attention

    def counting(text):
        calls.append(text)
        return original(text)

    for module in list(sys.modules.values()):  # every module's name for it (they import the function itself)
        if vars(module).get("parse_attention") is original:
            monkeypatch.setattr(module, "parse_attention", counting)
    subnet = Subnet(64, 3, (1, 2, 4), (128, 256, 512), ("local:32", "convmod:7", "gqa:2"))
    assert calls == ["local:32", "convmod:7", "gqa:2"]
    x = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        supernet(x, subnet)
        extract(supernet, subnet)(x)
    for workload in tiny.workloads:
        for cost in (flops, additive_terms, layered_terms):
            cost(tiny, subnet, workload)
    assert calls == ["local:32", "convmod:7", "gqa:2"]


def test_small_subnet_trains_only_its_slice(tiny):
    model = SuperTransformer(tiny, generator=torch.Generator().manual_seed(0))
    subnet = tiny.smallest()
    x = torch.randint(0, tiny.vocab_size, (2, 16))
    model(x, subnet).sum().backward()
    q = model.blocks[0].attn.q.weight.grad  # (max_heads*hd, max_embed)
    width = subnet.heads[0] * tiny.head_dim
    assert q[:width, : subnet.embed_dim].abs().sum() > 0
    assert q[width:].abs().sum() == 0 and q[:, subnet.embed_dim :].abs().sum() == 0
    assert model.blocks[1].attn.q.weight.grad is None  # inactive layer untouched


# Per-type attention tests (fast path == reference, causality of every path and of the model,
# patterns, cost, ONNX) live in test_attention_types.py and cover every registered type.


def test_local_window_ignores_far_tokens():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, 1, 50, 8, generator=g).unbind(0)
    s = parse_attention("local:5")
    k2, v2 = k.clone(), v.clone()
    k2[:, :, :30] = 0  # tokens 0..29 are outside the window of queries >= 34
    v2[:, :, :30] = 0
    a, b = attend(q, k, v, s), attend(q, k2, v2, s)
    assert torch.allclose(a[:, :, 34:], b[:, :, 34:], atol=1e-6)
    assert not torch.allclose(a[:, :, 30:34], b[:, :, 30:34])


def test_subnet_outside_space_is_refused(tiny, supernet):
    x = torch.randint(0, tiny.vocab_size, (1, 8))
    with pytest.raises(SubnetError, match=r"ffn_dim\[0\]: 100 is not one of 128, 256, 512"):
        supernet(x, Subnet(64, 1, (1,), (100,), ("softmax",)))
    with pytest.raises(UserError, match="sequence length 300 exceeds max_seq_len 256"):
        supernet(torch.zeros(1, 300, dtype=torch.long), tiny.smallest())


def test_same_seed_same_weights(tiny):
    a = SuperTransformer(tiny, generator=torch.Generator().manual_seed(3))
    b = SuperTransformer(tiny, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_supernet_on_meta_device_counts_without_memory():
    from search_spaces import load_space

    base = load_space("base")
    with torch.device("meta"):
        model = SuperTransformer(base)
    mix = sum(p.numel() for n, p in model.named_parameters() if ".mix." in n)  # weights of types the largest subnet does not use
    assert model.num_params(base.largest()) + mix == sum(p.numel() for p in model.parameters())
    assert model.num_params(base.smallest()) < model.num_params(base.largest())

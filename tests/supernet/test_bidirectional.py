"""Bidirectional encoders (task masked-lm), the foundation: the space layer, the bidirectional forms of
softmax, gqa, local (a symmetric window) and the kernel (linear) types, and the elastic supernet forward.
"""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from search_spaces import SpaceError, Subnet, UserError, load_space, parse_space
from search_spaces.attention import parse_attention
from supernet import SuperTransformer, extract, prefill
from supernet.attention import AttentionType, attend, attend_reference, get, register, unregister

from tests.supernet.test_train import one_thread  # noqa: F401  (autouse)

from tests.conftest import ROOT

BIDIRECTIONAL = ["softmax", "gqa:2", "local:5", "linear", "relu-linear", "cosformer:64", "performer:16"]
ENCODER = """
task: masked-lm
vocab_size: 64
max_seq_len: 48
head_dim: 8
embed_dim: [16, 24]
depth: [1, 2]
layers: {{heads: [2, 4], ffn_dim: [16, 32], attention: [{attention}]}}
latency: {{prefill: {{batch_size: 1, seq_len: 48}}}}
"""


# --------------------------------------------------------------------------- the space layer


def test_encoder_tiny_is_a_masked_lm_space_of_bidirectional_types():
    space = load_space("encoder-tiny")
    assert space.task == "masked-lm" and not space.causal
    assert [w.kind for w in space.workloads] == ["prefill"]
    assert all("bidirectional" in get(a).forms for a in space.attention)
    assert load_space("tiny").causal


def test_types_declare_their_forms():
    for name in ("softmax", "gqa:2", "local:8", "linear", "relu-linear", "cosformer:64", "performer:16", "dilated:4:2",
                 "longformer:4:2", "bigbird:4:2:1", "hydra", "sima", "msla:3"):  # fmt: skip
        assert get(name).forms == ("causal", "bidirectional"), name
    for name in ("strided:4", "fixed:4", "lsra:3", "convmod:3"):
        assert get(name).forms == ("causal",), name
    for name in ("linformer:8", "additive", "xca"):
        assert get(name).forms == ("bidirectional",), name


def test_masked_lm_space_with_a_causal_only_type_is_refused_naming_layer_and_type():
    with pytest.raises(SpaceError) as info:
        parse_space(ENCODER.format(attention="softmax, 'convmod:3'"), where="enc.yaml")
    assert info.value.errors == ["enc.yaml: layers.attention[1]: convmod:3 has no bidirectional form, which task masked-lm needs"]


class EncoderOnly(AttentionType):
    """(test) an encoder-only type: the mean of every value, whatever the query."""

    name = "test-mean"
    doc = "(test) every token gets the mean of all values (bidirectional only)"
    forms = ("bidirectional",)

    def bidirectional_reference(self, q, k, v, spec, w):
        return v.mean(2, keepdim=True).expand_as(v)


@pytest.fixture
def encoder_only():
    typ = register(EncoderOnly())
    yield typ
    unregister(typ.name)


def test_causal_space_with_an_encoder_only_type_is_refused(encoder_only):
    text = ENCODER.format(attention="softmax, test-mean").replace("task: masked-lm", "task: causal-lm")
    with pytest.raises(SpaceError) as info:
        parse_space(text, where="dec.yaml")
    assert info.value.errors == ["dec.yaml: layers.attention[1]: test-mean has no causal form, which task causal-lm needs"]
    assert parse_space(ENCODER.format(attention="softmax, test-mean")).attention == ("softmax", "test-mean")


def test_cli_refuses_a_masked_lm_decode_workload_in_one_line(tmp_path):
    path = tmp_path / "enc.yaml"
    decode = "seq_len: 48}, decode: {batch_size: 1, context: 8}}"
    path.write_text(ENCODER.format(attention="softmax").replace("seq_len: 48}}", decode))
    proc = subprocess.run([sys.executable, "-m", "nas", "space", str(path)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "enc.yaml: latency.decode: a decode workload needs a causal task, not masked-lm" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) <= 2, proc.stderr


# --------------------------------------------------------------------------- the math


def _qkv(spec: str, t: int = 70, heads: int = 4, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hk, hv = get(spec).heads(parse_attention(spec), heads)
    q = torch.randn(2, heads, t, d, generator=g)
    k = torch.randn(2, hk, t, d, generator=g)
    v = torch.randn(2, hv, t, d, generator=g)
    return q, k, v


@pytest.mark.parametrize("spec", BIDIRECTIONAL)
def test_fast_path_matches_reference(spec):
    q, k, v = _qkv(spec)
    s = parse_attention(spec)
    ref = attend_reference(q, k, v, s, causal=False)
    torch.testing.assert_close(attend(q, k, v, s, causal=False), ref, atol=2e-5, rtol=1e-4)
    # it is not the causal form: the first position sees later keys
    assert (ref[:, :, 0] - attend_reference(q, k, v, s)[:, :, 0]).abs().max() > 1e-3


@pytest.mark.parametrize("spec", BIDIRECTIONAL)
def test_an_early_query_sees_a_later_key_exactly_when_its_form_says(spec):
    q, k, v = _qkv(spec, t=20)
    s = parse_attention(spec)
    v2 = v.clone()
    v2[:, :, 3] += 1.0  # change the value at position 3
    moved = (attend(q, k, v2, s, causal=False) - attend(q, k, v, s, causal=False)).abs().amax(dim=(0, 1, 3))  # (T,)
    seen = torch.ones(20, dtype=torch.bool)
    if s.kind == "local":
        seen = (torch.arange(20) - 3).abs() < s.param("W")  # the symmetric window: positions 0..7
    assert (moved[seen] > 1e-6).all() and (moved[~seen] == 0).all(), moved


def _loop_softmax(q, k, v, window=None):
    """Row by row, from the definition: softmax over the keys j a query i sees (|i - j| < W, or all)."""
    b, h, t, d = q.shape
    k, v = k.repeat_interleave(h // k.shape[1], 1), v.repeat_interleave(h // v.shape[1], 1)
    out = torch.empty_like(q)
    for i in range(t):
        js = [j for j in range(t) if window is None or abs(i - j) < window]
        scores = torch.stack([(q[:, :, i] * k[:, :, j]).sum(-1) / math.sqrt(d) for j in js], -1)  # (B, H, n)
        out[:, :, i] = (scores.softmax(-1).unsqueeze(-1) * v[:, :, js]).sum(2)
    return out


@pytest.mark.parametrize("spec, window", [("softmax", None), ("gqa:2", None), ("local:3", 3)])
def test_softmax_family_reference_is_the_definition(spec, window):
    q, k, v = _qkv(spec, t=9, d=4)
    ref = attend_reference(q, k, v, parse_attention(spec), causal=False)
    torch.testing.assert_close(ref, _loop_softmax(q, k, v, window), atol=1e-5, rtol=1e-5)


def test_linear_reference_is_the_definition():
    q, k, v = _qkv("linear", t=7, d=4)
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    out = torch.empty_like(q)
    for i in range(7):
        a = (fq[:, :, i : i + 1] * fk).sum(-1)  # (B, H, T): every key, before and after i
        out[:, :, i] = (a.unsqueeze(-1) * v).sum(2) / (a.sum(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(attend_reference(q, k, v, parse_attention("linear"), causal=False), out)


# --------------------------------------------------------------------------- the elastic supernet


@pytest.fixture(scope="module")
def encoder():
    space = parse_space(ENCODER.format(attention=", ".join(f"'{a}'" for a in BIDIRECTIONAL)).replace("[1, 2]", "[1, 2, 3]"))
    return space, SuperTransformer(space, torch.Generator().manual_seed(0)).eval()


def _subnets(space):
    rng = np.random.default_rng(0)
    per_type = [Subnet(24, 2, (4, 2), (32, 16), (a, "softmax")) for a in BIDIRECTIONAL]
    return [space.largest(), space.smallest(), *per_type, *(space.sample(rng) for _ in range(4))]


def test_supernet_forward_is_bidirectional_and_extraction_matches(encoder):
    space, supernet = encoder
    idx = torch.randint(0, 64, (2, 48), generator=torch.Generator().manual_seed(1))
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 64  # only the last token differs
    with torch.no_grad():
        for sub in _subnets(space):
            logits = supernet(idx, sub)
            static = extract(supernet, sub)
            assert not static.config.causal
            torch.testing.assert_close(static(idx), logits, atol=1e-5, rtol=1e-5)
            first = (supernet(changed, sub)[:, 0] - logits[:, 0]).abs().max()
            # local:5 at depth 2 reaches 8 positions: the first token sees the last one only through full-reach layers
            reach = all(parse_attention(a).kind == "local" for a in sub.attention)
            assert (first == 0) if reach else (first > 1e-6), (sub, first)


def test_an_encoder_has_no_decoding_cache(encoder):
    space, supernet = encoder
    static = extract(supernet, space.smallest())
    with pytest.raises(UserError,
                       match="bidirectional encoder \\(task masked-lm or sequence-classification\\): it has no decoding cache"):
        prefill(static, torch.zeros(1, 4, dtype=torch.long))

"""bf16 autocast (how training and scoring run on CUDA) through every attention type, checked on the CPU.

CUDA autocast is not reachable here, but CPU autocast casts the same operations (matmul, bmm, linear to
bf16; softmax, sums to fp32), so a type that mixes dtypes under autocast fails here as it failed on an H200
(the linear family's fp32 prefix sums: ``baddbmm_`` of a bf16 product with fp32 chunk states)."""

from __future__ import annotations

import pytest
import torch

from search_spaces import LayerChoice, parse_attention
from supernet import Transformer, TransformerConfig
from supernet.attention import REGISTRY, attend

from tests.supernet.attention.test_attention_types import ALL_TYPES

ENCODER_TYPES = [a for a in ALL_TYPES if "bidirectional" in REGISTRY[parse_attention(a).kind].forms] + [
    "linformer:8", "additive", "xca"]  # fmt: skip


def _losses(causal: bool, types: list[str]):
    config = TransformerConfig(64, 48, 8, "rope", 16, tuple(LayerChoice(2, 16, a) for a in types), causal=causal)
    model = Transformer(config, generator=torch.Generator().manual_seed(0))
    idx = torch.randint(0, 64, (2, 37), generator=torch.Generator().manual_seed(1))
    grads = {}
    for name, amp in (("fp32", False), ("bf16", True)):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            logits = model(idx)  # (B, T, V)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), idx.flatten())
        loss.backward()
        grads[name] = (logits.float().detach(), torch.cat([p.grad.flatten() for p in model.parameters()]))
    return grads


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_every_type_trains_under_bf16_autocast_close_to_fp32(causal):
    grads = _losses(causal, ALL_TYPES if causal else ENCODER_TYPES)
    (l32, g32), (l16, g16) = grads["fp32"], grads["bf16"]
    assert l16.isfinite().all() and g16.isfinite().all()
    assert (l16 - l32).abs().max().item() <= 0.05 * l32.abs().max().item()
    assert torch.nn.functional.cosine_similarity(g16, g32, dim=0).item() >= 0.99


def test_under_autocast_a_type_gets_one_dtype_and_autocast_off():
    """attend hands a type q's dtype for k, v and its own weights, with autocast off inside."""
    seen = {}
    typ = REGISTRY["msla"]
    spec = parse_attention("msla:3")
    forward = typ.forward

    def spy(q, k, v, spec, w):
        seen.update(dtypes={q.dtype, k.dtype, v.dtype, *(x.dtype for x in w.values())},
                    autocast=torch.is_autocast_enabled("cpu"))  # fmt: skip
        return forward(q, k, v, spec, w)

    q = torch.randn(1, 2, 20, 8, dtype=torch.bfloat16)
    k, v = torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8)  # fp32, as a cache or a caller might give
    w = {n: torch.randn(s) for n, s in typ.weights(spec, 2, 8).items()}
    typ.forward = spy
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = attend(q, k, v, spec, w)
        assert seen == {"dtypes": {torch.bfloat16}, "autocast": False} and out.dtype == torch.bfloat16
        seen.clear()
        attend(q.float(), k, v, spec, w)  # no autocast: as given
        assert seen == {"dtypes": {torch.float32}, "autocast": False}
    finally:
        del typ.forward


def test_shapes_on_the_meta_device_pass_through():
    """A forward on the meta device (shapes, no memory) asks no autocast question torch cannot answer there."""
    q = torch.empty(1, 2, 9, 8, device="meta")
    assert attend(q, q, q, parse_attention("softmax")).shape == (1, 2, 9, 8)

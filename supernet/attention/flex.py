"""The CUDA path of the sparse types: FlexAttention with a block mask per (pattern, length).

``flex_attention`` is only fast compiled.  One compiled kernel serves a shape; a new shape
compiles a new one (cached by torch.compile), and a block mask is built once per (type,
length, device) and cached here.  torch.compile silently falls back to the slow eager
kernel once it has recompiled too often; here that limit is raised to
:data:`MAX_KERNELS` and hitting it raises an error instead (``fail_on_recompile_limit_hit``),
so a run never quietly degrades.  (FlexAttention has a forward on CPU too, but no backward:
the CPU path is the block engine in :mod:`.blocks`.)
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from search_spaces.attention import AttentionSpec


MAX_KERNELS = 64  # distinct (type, shape, dtype) kernels one process may compile


@lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@lru_cache(maxsize=256)
def block_mask(pattern, spec: AttentionSpec, t: int, device: torch.device):
    """The FlexAttention block mask of ``pattern`` at length ``t`` (built once per type, length and device)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        return pattern(q_idx, kv_idx, spec)

    return create_block_mask(mask_mod, None, None, t, t, device=device)


_KERNELS: set[tuple] = set()


def flex_attend(q: Tensor, k: Tensor, v: Tensor, spec: AttentionSpec, pattern) -> Tensor:
    """softmax attention of q, k, v (B, H, T, D) under ``pattern``, with compiled FlexAttention."""
    kernel = (spec, tuple(q.shape), tuple(k.shape), q.dtype, q.device)
    if kernel not in _KERNELS and len(_KERNELS) >= MAX_KERNELS:
        raise RuntimeError(
            f"FlexAttention has compiled {MAX_KERNELS} kernels (attention type x shape) in this process; "
            f"{spec} at {tuple(q.shape)} would compile another. Pad batches to a few fixed lengths, or raise "
            "supernet.attention.flex.MAX_KERNELS."
        )
    _KERNELS.add(kernel)
    mask = block_mask(pattern, spec, q.shape[-2], q.device)
    limit = max(torch._dynamo.config.recompile_limit, MAX_KERNELS)
    with torch._dynamo.config.patch(recompile_limit=limit, fail_on_recompile_limit_hit=True):
        return _compiled_flex()(q, k, v, block_mask=mask)

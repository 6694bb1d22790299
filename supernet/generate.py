"""Sampling text from a static byte-level Transformer."""

from __future__ import annotations

from typing import Callable

import torch

from .model import Transformer


@torch.no_grad()
def generate(
    model: Transformer,
    prompt: bytes,
    max_new_tokens: int,
    *,
    temperature: float = 0.8,
    top_k: int | None = 40,
    generator: torch.Generator | None = None,
    on_token: Callable[[int], None] | None = None,
) -> bytes:
    """Continue ``prompt`` by ``max_new_tokens`` bytes. ``temperature == 0`` is greedy decoding.

    The context is the last ``max_seq_len`` tokens (a sliding window over the text).
    """
    model.eval()
    device = model.tok_emb.weight.device
    tokens = list(prompt) or [ord("\n")]
    for _ in range(max_new_tokens):
        idx = torch.tensor([tokens[-model.config.max_seq_len :]], dtype=torch.long, device=device)
        logits = model(idx)[0, -1].float()  # (vocab,)
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.numel():
                kth = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            nxt = int(torch.multinomial(probs.cpu(), 1, generator=generator))
        tokens.append(nxt)
        if on_token is not None:
            on_token(nxt)
    return bytes(tokens[len(prompt) or 1 :])

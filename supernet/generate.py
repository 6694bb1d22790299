"""Sampling text from a static byte-level Transformer, one cached decode step per token."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from search_spaces import UserError

from .decode import DecodeCache, decode_step, prefill
from .model import Transformer

OVERFLOW = ("reprefill", "slide", "continue")


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
    overflow: str = "reprefill",
    keep: int | None = None,
    vocabulary: Any = None,
) -> bytes:
    """Continue ``prompt`` by ``max_new_tokens`` tokens (bytes for a byte model); the bytes they spell.
    ``temperature == 0`` is greedy decoding; ``vocabulary``: the model's (:class:`supernet.tokenizer.Vocabulary`, its
    folder's ``tokenizer.json``) that reads the prompt and spells the tokens; None: the ids are the bytes.

    The prompt (its last ``max_seq_len`` bytes) is prefilled once, then every new token costs one
    :func:`~supernet.decode.decode_step`.  Up to ``max_seq_len`` tokens of context the logits are
    those of the full model on the whole text (as an uncached loop computes them).  Past that,
    ``overflow`` decides:

    * ``'reprefill'``: re-read the last ``keep`` tokens (default ``max_seq_len // 2``) into a fresh
      cache and decode on; one prefill per ``max_seq_len - keep`` tokens;
    * ``'slide'``: run the full model on the last ``max_seq_len`` tokens for every further token
      (exactly an uncached sliding window, and as slow);
    * ``'continue'``: decode on past ``max_seq_len`` (rotary models without cosformer layers).

    A model with a memory (``memory:`` in its space, :mod:`supernet.memory`) needs none of these: its cache keeps the
    last ``memory`` tokens of each full window and it decodes on at a bounded cost (``overflow`` is not read).
    """
    if overflow not in OVERFLOW:
        raise UserError(f"overflow: {overflow!r}; expected one of {', '.join(OVERFLOW)}")
    limit = model.config.max_seq_len
    keep = limit // 2 if keep is None else keep
    if not 1 <= keep <= limit:
        raise UserError(f"keep: {keep}; expected 1 ... max_seq_len {limit}")
    if overflow == "continue":
        _check_can_continue(model)
    model.eval()
    device = model.tok_emb.weight.device
    tokens = (vocabulary.encode(prompt).tolist() if vocabulary is not None else list(prompt)) or [ord("\n")]
    given = len(tokens) if prompt else 1
    logits, cache = _prefill(model, tokens[-limit:], device)
    for n in range(max_new_tokens):
        nxt = _sample(logits, temperature, top_k, generator)
        tokens.append(nxt)
        if on_token is not None:
            on_token(nxt)
        if n + 1 == max_new_tokens:
            break
        if cache.length < limit or overflow == "continue" or model.config.memory:
            step_logits, cache = decode_step(model, torch.tensor([[nxt]], device=device), cache)
            logits = step_logits[0, -1]
        else:
            logits, cache = _prefill(model, tokens[-(limit if overflow == "slide" else keep) :], device)
    new = tokens[given:]
    return vocabulary.decode(new) if vocabulary is not None else bytes(new)


def _prefill(model: Transformer, context: list[int], device) -> tuple[Tensor, DecodeCache]:
    logits, cache = prefill(model, torch.tensor([context], dtype=torch.long, device=device))
    return logits[0, -1], cache


def _sample(logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> int:
    """One token from logits (vocab,): argmax at temperature 0, else top-k sampling."""
    logits = logits.float()
    if temperature <= 0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def _check_can_continue(model: Transformer) -> None:
    if model.pos_emb is not None:
        raise UserError(
            "overflow 'continue': this model has learned positions, which end at max_seq_len; use 'reprefill' or 'slide'"
        )
    limited = [f"{b.attn.spec} is defined only up to position {b.attn.typ.position_limit(b.attn.spec)}" for b in model.blocks
               if b.attn.typ.position_limit(b.attn.spec) is not None]  # fmt: skip
    if limited:
        raise UserError(f"overflow 'continue': {'; '.join(limited)}; use 'reprefill' or 'slide'")

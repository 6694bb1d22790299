"""Held-out scoring: bits per scored token of a model on fixed windows of a token array.

One implementation serves supernet training's evaluation (``supernet.train.evaluate_bpb``), the
search's fitness (``supernet.scoring.InheritedLoss``) and the model card of an export.  The
windows are fixed when the :class:`HeldOut` is made, so every subnet and every call sees the same
bytes and differences between subnets are not sampling noise.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from search_spaces import Subnet

from .data import windows

LN2 = math.log(2.0)
IGNORE = -100  # a target that is not scored (torch's cross-entropy ignore_index)
Windows = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets) (W, T) each


def autocast(device: torch.device):
    """bf16 autocast on CUDA, nothing (fp32) elsewhere."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def run_model(model: nn.Module, inputs: torch.Tensor | tuple[torch.Tensor, ...], subnet: Subnet | None) -> torch.Tensor:
    """``model(*inputs, subnet=subnet)`` for a supernet, ``model(*inputs)`` for a static model (subnet None); ``inputs``
    one tensor (a token sequence) or a task's tuple (an encoder-decoder's source and decoder inputs)."""
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    return model(*inputs) if subnet is None else model(*inputs, subnet=subnet)


class StaticAsSupernet(nn.Module):
    """A static model behind the supernet interface ``model(idx, subnet)`` (its own subnet only), so
    :class:`supernet.scoring.InheritedLoss` scores it on exactly the search's windows."""

    def __init__(self, model: nn.Module, space):
        super().__init__()
        self.model, self.space = model, space

    def forward(self, idx: torch.Tensor, subnet: Subnet) -> torch.Tensor:
        assert subnet == self.model.subnet, "a static model runs only its own subnet"
        return self.model(idx)  # (B, T, V)


class HeldOut:
    """The windows ``tokens[s : s + seq_len + 1]`` for each start ``s`` in ``starts``.

    With ``transform`` (a task's: a masked LM's, :meth:`tasks.masked_lm.learner.MaskedLM.heldout`) the windows
    become what the task scores, once, here: ``transform(inputs, targets)`` -> (inputs, targets), targets
    :data:`IGNORE` where a position is not scored (a masked LM's inputs are the windows with fixed masks, and the
    bits are per masked byte).

    With ``token_lengths`` (each id's length in bytes: a subword vocabulary's, :mod:`supernet.tokenizer`) a window's
    summed loss is divided by the bytes its scored targets spell, not by their count: bits per byte of text, the unit
    in which vocabularies compare.
    """

    def __init__(self, tokens: np.ndarray, starts: np.ndarray, seq_len: int,
                 transform: Callable[[torch.Tensor, torch.Tensor], Windows] | None = None,
                 token_lengths: np.ndarray | None = None):
        x, y = windows(np.asarray(tokens).reshape(-1), np.asarray(starts, dtype=np.int64), seq_len)  # (W, T) each
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        if transform is not None:
            self.x, self.y = transform(self.x, self.y)
        self.scored = (self.y != IGNORE).sum(1).double()  # (W,) scored positions per window
        self.per_byte = token_lengths is not None
        if token_lengths is not None:  # (W,) the bytes the scored targets spell
            lengths = torch.as_tensor(np.asarray(token_lengths, dtype=np.float64))
            self.scored = torch.where(self.y != IGNORE, lengths[self.y.clamp(min=0)], 0.0).sum(1)
        self.seq_len = seq_len

    @classmethod
    def of(cls, inputs: np.ndarray, targets: np.ndarray) -> "HeldOut":
        """Fixed held-out examples given whole: ``inputs`` and ``targets`` (W, T), targets :data:`IGNORE` where a position
        is not scored (a classification task's: every position but the one that predicts the label)."""
        held = cls.__new__(cls)
        held.x, held.y = torch.as_tensor(np.asarray(inputs)), torch.as_tensor(np.asarray(targets))
        held.scored = (held.y != IGNORE).sum(1).double()  # (W,)
        held.seq_len = held.x.shape[1]
        held.per_byte = False
        return held

    @property
    def tokens(self) -> int:
        """Scored (predicted) tokens."""
        return int(self.scored.sum())

    @torch.no_grad()
    def bits(self, model: nn.Module, subnet: Subnet | None = None, batch_size: int = 16, mixed_precision: bool = True) -> float:
        """Mean next-token cross-entropy in bits (bits per byte for byte-level models).

        Runs in eval mode without gradients; bf16 autocast on CUDA unless ``mixed_precision`` is off.  Per byte (with
        ``token_lengths``): the summed loss of every window over the bytes of every window.
        """
        per_window = self.window_bits(model, subnet, batch_size, mixed_precision)
        if self.per_byte:
            weights = self.scored.numpy()
            return float((per_window * weights).sum() / weights.sum())
        return float(per_window.mean())

    @torch.no_grad()
    def window_bits(
        self, model: nn.Module, subnet: Subnet | None = None, batch_size: int = 16, mixed_precision: bool = True
    ) -> np.ndarray:
        """Mean bits per scored token (per scored byte with ``token_lengths``) of each window, (W,) float64: the windows are
        the units of a standard error, and two models scored on the same windows are compared window by window (paired)."""
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        sums = []
        amp = autocast(device) if mixed_precision else nullcontext()
        try:
            for i in range(0, len(self.x), batch_size):
                x, y = self.x[i : i + batch_size].to(device), self.y[i : i + batch_size].to(device)  # (B, T)
                with amp:
                    logits = run_model(model, x, subnet)  # (B, T, V)
                ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none", ignore_index=IGNORE)  # (B*T,)
                ce = ce.view(y.shape)  # (B, T), 0 where not scored
                sums.append(ce.double().sum(1).cpu())
        finally:
            model.train(was_training)
        return (torch.cat(sums) / self.scored / LN2).numpy()

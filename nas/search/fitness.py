"""Fitness: validation loss of a subnet with weights inherited from the supernet.

:class:`InheritedLoss` cuts ``windows`` fixed windows of ``seq_len + 1`` tokens from a held-out
token array (positions drawn once from ``seed``), and scores a subnet by its mean next-token
cross-entropy over all of them, in bits (bits per byte for the byte-level spaces).  The same
windows score every subnet, so differences between subnets are not sampling noise.
:class:`~nas.search.cache.BatchCache` (``CachedFitness``) evaluates each distinct subnet once.  A fitness function is anything
``subnets -> np.ndarray of losses``; the strategies and the driver take it as an argument.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from search_spaces import Subnet, UserError

FitnessFn = Callable[[Sequence[Subnet]], np.ndarray]


def pick_device(name: str = "auto") -> str:
    """``auto``: the GPU when there is one, else the CPU; otherwise the name, checked."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device: {name!r} asked for, but torch sees no CUDA device (use cpu or auto)")
    if name != "cpu" and not name.startswith("cuda"):
        raise UserError(f"--device: {name!r} is not one of auto, cpu, cuda, cuda:N")
    return name


def validation_tokens(supernet_path: str | Path, payload: dict[str, Any], val_data: str | Path | None = None,
                      data_cache: str | Path | None = None) -> tuple[np.ndarray, str]:
    """The held-out tokens and where they come from: ``val_data`` bytes (``--val-data``), else the validation
    split of the data the checkpoint at ``supernet_path`` (loaded as ``payload``) was trained on, encoded in
    ``data_cache`` (``--data-cache``; default: the checkpoint's directory)."""
    if val_data:
        path = Path(val_data)
        if not path.is_file():
            raise UserError(f"--val-data: {path}: no such file")
        return np.fromfile(path, dtype=np.uint8), f"--val-data {path}"
    meta = payload.get("meta", {})
    missing = [k for k in ("data", "data_seed", "val_fraction") if k not in meta]
    if missing:
        raise UserError(
            f"{supernet_path}: the checkpoint does not say which data it was trained on (meta lacks {', '.join(missing)}); "
            "pass --val-data FILE"
        )
    from supernet.data import prepare_corpus

    cache = Path(data_cache) if data_cache else Path(supernet_path).resolve().parent
    corpus = prepare_corpus(meta["data"], cache, meta["data_seed"], meta["val_fraction"])
    return (
        corpus.val,
        f"validation split of {meta['data'] or 'the default corpus'} (seed {meta['data_seed']}, fraction {meta['val_fraction']})",
    )


class InheritedLoss:
    """Mean next-token loss in bits of ``supernet(idx, subnet)`` over fixed held-out windows."""

    def __init__(
        self,
        supernet,
        tokens: np.ndarray,
        *,
        seq_len: int = 128,
        windows: int = 16,
        batch_size: int = 16,
        seed: int = 0,
        device: str = "cpu",
        where: str = "validation tokens",
    ):
        tokens = np.asarray(tokens).reshape(-1)
        space = supernet.space
        if seq_len < 1 or seq_len > space.max_seq_len:
            raise UserError(f"--seq-len: {seq_len} is not in 1..{space.max_seq_len} (max_seq_len of space {space.name!r})")
        if windows < 1 or batch_size < 1:
            raise UserError(f"--val-windows / --eval-batch: {windows} / {batch_size} must be positive")
        if len(tokens) < seq_len + 1:
            raise UserError(f"{where}: {len(tokens)} tokens are fewer than one window of --seq-len {seq_len} + 1")
        if len(tokens) and int(tokens.max()) >= space.vocab_size:
            raise UserError(
                f"{where}: token {int(tokens.max())} is outside the vocabulary of space {space.name!r} ({space.vocab_size})"
            )
        from supernet.heldout import HeldOut

        rng = np.random.default_rng(seed)
        n_starts = len(tokens) - seq_len
        starts = np.sort(rng.choice(n_starts, size=min(windows, n_starts), replace=False))
        self.model = supernet.to(device).eval()
        self.heldout = HeldOut(tokens, starts, seq_len)
        self.batch_size = batch_size
        self.description = {"windows": int(len(starts)), "seq_len": seq_len, "seed": seed, "tokens": self.heldout.tokens}

    def __call__(self, subnets: Sequence[Subnet]) -> np.ndarray:
        # fp32 even on a GPU: bf16 rounding would reorder subnets whose losses are close
        return np.array(
            [self.heldout.bits(self.model, s, self.batch_size, mixed_precision=False) for s in subnets], dtype=np.float64
        )

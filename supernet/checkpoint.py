"""Supernet checkpoints: one ``torch.save`` dict, written atomically, loaded with ``weights_only=True``.

A checkpoint carries its own space (so a supernet loads without the YAML file), the
space hash, the model state and whatever the trainer needs to resume exactly
(optimizer, scheduler, RNG states, data position, step) under ``state``.

Loading checks, and names the file in every error: that it is a readable torch file,
that it is one of ours (``format``), its version, and, when a space is given, that
it was trained on that space.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import yaml

from search_spaces import Space, UserError, parse_space, tasks
from search_spaces.errors import first_line

from .files import atomic_write

FORMAT = "nas-supernet-checkpoint"
VERSION = 1


def save_checkpoint(path: str | Path, model: torch.nn.Module, state: dict[str, Any] | None = None, **meta: Any) -> Path:
    """Write ``model`` (+ resumable ``state`` and small ``meta`` values) to ``path`` atomically.

    The file is written beside the target and renamed over it, so a kill during the save
    leaves the previous checkpoint intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    space = model.space
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "space": yaml.safe_dump(space.to_dict(), sort_keys=False),
        "space_hash": space.hash,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "state": state or {},
        "meta": meta,
    }
    return atomic_write(path, lambda f: torch.save(payload, f))


def read_torch(path: str | Path, what: str = "supernet checkpoint") -> Any:
    """``torch.load(weights_only=True)`` of a file of ours (nothing in it runs code); one line naming it otherwise."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint file")
    try:
        with warnings.catch_warnings():  # a foreign pickle makes torch warn before it refuses; the error below says it all
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, not a torch file, or a pickle that needs code to load
        raise UserError(f"{path}: not a readable {what} {load_problem(path, e)}") from None


def load_checkpoint(path: str | Path, space: Space | None = None, payload: dict | None = None) -> dict[str, Any]:
    """Read and validate a checkpoint dict (``payload``: the file already read by :func:`read_torch`); with ``space``,
    refuse one trained on another space."""
    path = Path(path)
    if payload is None:
        payload = read_torch(path)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise UserError(f"{path}: not a supernet checkpoint of this tool (no '{FORMAT}' format marker)")
    if payload.get("version") != VERSION:
        raise UserError(f"{path}: checkpoint version {payload.get('version')!r}, this tool reads version {VERSION}")
    try:
        payload["space"] = parse_space(payload["space"], where=f"{path.name}[space]", source=f"{path}")
    except UserError as e:
        raise UserError(f"{path}: the space stored in the checkpoint is invalid: {e}") from None
    if payload["space"].hash != payload.get("space_hash"):
        raise UserError(
            f"{path}: stored space hash {payload.get('space_hash')} does not match its space ({payload['space'].hash})"
        )
    rates = measured_bytes_per_token(payload)
    if rates and hasattr(payload["space"], "with_bytes_per_token"):  # prefills in bytes of text: each vocabulary's tokens
        payload["space"] = payload["space"].with_bytes_per_token(rates)
    # the models must agree (arch_hash); the latency workloads a space lists may differ
    if space is not None and space.arch_hash != payload["space"].arch_hash:
        raise UserError(
            f"{path}: trained on space {payload['space'].name!r} (hash {payload['space_hash']}), "
            f"not on {space.name!r} (hash {space.hash}) from {space.source}"
        )
    return payload


def measured_bytes_per_token(payload: dict[str, Any]) -> dict[int, float] | None:
    """A checkpoint's bytes per token of each vocabulary, as its run's tokenizer measured them on the validation split
    (``meta.vocabulary.bytes_per_token``); None for a run that read bytes."""
    rates = ((payload.get("meta") or {}).get("vocabulary") or {}).get("bytes_per_token")
    return {int(k): float(v) for k, v in rates.items()} if rates else None


def load_problem(path: Path, e: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` refused ``path``, in our words (torch's own message suggests
    ``weights_only=False``, which would run the file's code: not advice to quote)."""
    size = path.stat().st_size
    if size == 0:
        return "(the file is empty: 0 bytes, a copy or a save that did not finish)"
    text = str(e)
    if "Weights only load failed" in text or "weights_only" in text:
        return "(it holds objects that need code to load, a pickle: refused, loading runs no code)"
    return f"(truncated or foreign file): {type(e).__name__}: {first_line(e)}"


def load_marked(path: Path, marker: str, what: str, payload: dict | None = None) -> dict[str, Any]:
    """A training checkpoint of ours (``torch.load(weights_only=True)``; ``payload``: already read) checked for its
    ``format`` marker; one line naming the file otherwise.  ``what``: the kind of checkpoint expected, for the message."""
    if payload is None:
        payload = read_torch(path, "training checkpoint")
    if not isinstance(payload, dict) or payload.get("format") != marker:
        raise UserError(f"{path}: not a {what} (no '{marker}' format marker)")
    return payload


def load_supernet(
    path: str | Path, space: Space | None = None, device: str | torch.device = "cpu"
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The supernet stored in ``path`` (the model of its space's task: a :class:`SuperTransformer` for a one-stack
    space; eval mode) and the checkpoint dict."""
    payload = load_checkpoint(path, space)
    split = any(".attn.fam." in name for name in payload["model"])  # a --split families run: Q/K/V/O per family too
    model = tasks.of(payload["space"]).supernet(payload["space"], **({"split_families": True} if split else {}))
    return fill_supernet(model, payload, path, device), payload


def fill_supernet(model: torch.nn.Module, payload: dict[str, Any], path: str | Path, device: str | torch.device = "cpu"):
    """``model`` (built for the checkpoint's space) with the checkpoint's weights, on ``device``, in eval mode."""
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as e:
        raise UserError(f"{Path(path)}: weights do not fit the stored space: {str(e).splitlines()[0]}") from None
    return model.to(device).eval()

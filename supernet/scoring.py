"""Scoring a subnet or a trained model on held-out data: what the search ranks by, what a card reports.

:class:`InheritedLoss` cuts ``windows`` fixed windows of ``seq_len + 1`` tokens from a held-out token array (positions
drawn once from ``seed``) and scores a subnet of a one-stack supernet by its mean loss over all of them, in bits (bits
per byte for the byte-level spaces), as the space's task scores (a masked LM: its fixed masks).  The same windows
score every subnet, so differences between subnets are not sampling noise.  :class:`HeldOutFitness` does the same over
a task's own fixed examples.  A fitness is anything ``subnets -> np.ndarray of losses`` with ``static(model)`` (a
trained model's score on the same data) and a ``description``; :class:`FitnessSettings` are the scoring flags.

These sit below the tasks and the search alike: a task builds its fitness from them
(:meth:`tasks.base.Task.fitness`), the search calls it, and neither calls the other back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from search_spaces import Space, Subnet, UserError, tasks

from .files import file_problem
from .heldout import StaticAsSupernet
from .model import Transformer
from .quantized import CALIBRATION_WINDOWS, MAX_ERROR, Simulated, calibrate, calibration_feeds
from .task import model_vocab, task_for, trained_options
from .tokenizer import Tokens, Vocabulary

FitnessFn = Callable[[Sequence[Subnet]], np.ndarray]


def pick_device(name: str = "auto") -> str:
    """``auto``: the GPU when there is one, else the CPU; otherwise the name, checked."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda") and not (name.startswith("cuda:") and name[5:].isdigit()):
        raise UserError(f"--device: {name!r} is not one of auto, cpu, cuda, cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device: {name!r} asked for, but torch sees no CUDA device (use cpu or auto)")
    return name


def validation_tokens(supernet_path: str | Path, payload: dict[str, Any], val_data: str | Path | None = None,
                      data_cache: str | Path | None = None) -> tuple[np.ndarray, str]:
    """The held-out tokens and where they come from: ``val_data`` bytes (``--val-data``), else the validation
    split of the data the checkpoint at ``supernet_path`` (loaded as ``payload``) was trained on, encoded in
    ``data_cache`` (``--data-cache``; default: the checkpoint's directory)."""
    trained = (payload.get("meta") or {}).get("vocabulary")  # a subword space's vocabulary, as the run trained it
    if val_data:
        path = Path(val_data)
        problem = file_problem(path)
        if problem:
            raise UserError(f"--val-data: {path}: {problem}; expected a file of held-out text")
        data = np.fromfile(path, dtype=np.uint8)
        return (data if trained is None else tokens_of(data, trained)), f"--val-data {path}"
    task = tasks.of(payload["space"])  # the data is the checkpoint's task's
    record = task.data_record(payload.get("meta", {}), str(supernet_path), hint="; pass --val-data FILE")
    cache = Path(data_cache) if data_cache else Path(supernet_path).resolve().parent
    data = task.prepare_data(record, cache)
    if trained is not None and data.vocabulary.sha256 != trained["sha256"]:
        raise UserError(f"{supernet_path}: trained with tokenizer {trained['sha256'][:16]}, but the data cache now gives "
                        f"{data.vocabulary.sha256[:16]} (another tokenizers version?): scores would not compare")
    return data.val, task.describe_split(record)


def tokens_of(data: np.ndarray, trained: dict[str, Any]) -> Tokens:
    """Bytes read at each vocabulary of a run's (its meta's ``vocabulary``: the tokenizer.json and the sizes)."""
    vocab = Vocabulary(trained["json"])
    raw = np.asarray(data, dtype=np.uint8).tobytes()
    arrays = {int(k): vocab.at(int(k)).encode(raw).astype(np.uint16) for k in trained["sizes"]}
    return Tokens(arrays, vocab.token_lengths())


class InheritedLoss:
    """Mean loss in bits of ``supernet(idx, subnet)`` over fixed held-out windows, scored as the space's task scores
    them (its learner's held-out windows: every next token for a decoder; a masked LM's fixed masks, at its
    ``options["mask_rate"]``, bits per masked byte)."""

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
        precision: str = "fp32",
        options: dict[str, Any] | None = None,
    ):
        space = supernet.space
        if seq_len < 1 or seq_len > space.max_seq_len:
            raise UserError(f"--seq-len: {seq_len} is not in 1..{space.max_seq_len} (max_seq_len of space {space.name!r})")
        if windows < 1 or batch_size < 1:
            raise UserError(f"--val-windows / --eval-batch-size: {windows} / {batch_size} must be positive")
        # a corpus read at subword vocabularies: windows of each vocabulary's tokens, scored per byte of text
        arrays = {v: np.asarray(tokens.at(v)).reshape(-1) for v in tokens.sizes} if isinstance(tokens, Tokens) \
            else {None: np.asarray(tokens).reshape(-1)}
        lengths = tokens.lengths if isinstance(tokens, Tokens) else None
        self.sizes = tuple(v for v in arrays if v is not None)
        self.model = supernet.to(device).eval()
        task = task_for(space, seed=seed, **(options or {}))  # (a masked LM's fixed masks: a function of the seed only)
        self.heldouts = {}
        for vocab, array in arrays.items():
            limit = space.vocab_size if vocab is None else vocab
            if len(array) < seq_len + 1:
                raise UserError(f"{where}: {len(array)} tokens are fewer than one window of --seq-len {seq_len} + 1")
            if len(array) and int(array.max()) >= limit:
                raise UserError(f"{where}: token {int(array.max())} is outside the vocabulary of space {space.name!r} ({limit})")
            rng = np.random.default_rng(seed)
            n_starts = len(array) - seq_len
            starts = np.sort(rng.choice(n_starts, size=min(windows, n_starts), replace=False))
            held = task.heldout(array, starts, seq_len) if lengths is None else task.heldout(array, starts, seq_len, lengths)
            self.heldouts[vocab] = held
        self.heldout = self.heldouts[max(self.sizes)] if self.sizes else self.heldouts[None]
        self.batch_size = batch_size
        self.description = {"windows": int(len(self.heldout.x)), "seq_len": seq_len, "seed": seed,
                            "tokens": self.heldout.tokens, **task.to_dict()}  # (nothing more for a decoder: studies of
        if self.sizes:  # earlier versions still resume)
            self.description["vocabularies"] = {str(v): self.heldouts[v].tokens for v in self.sizes}
        self.precision, self.calibration = precision, None
        if precision != "fp32":  # absent at fp32: studies of earlier versions still resume
            smallest = arrays[min(self.sizes)] if self.sizes else arrays[None]  # ids every vocabulary has
            feeds = calibration_feeds(smallest, seq_len, CALIBRATION_WINDOWS, seed=seed + 1, where=where)
            self.calibration = [torch.from_numpy(f["tokens"]).to(device) for f in feeds]
            self.max_error = MAX_ERROR
            self.description.update(precision=precision, calibration={"windows": len(feeds), "seed": seed + 1,
                                                                      "max_error": MAX_ERROR})

    def held(self, model, subnet: Subnet | None):
        """The held-out windows ``subnet`` (or a static ``model``) reads: its vocabulary's."""
        return self.heldouts[model_vocab(model, subnet, self.sizes)] if self.sizes else self.heldout

    def scorer(self, subnet: Subnet):
        """The model that scores ``subnet``: the supernet, or at an INT8 precision the supernet with ONNX Runtime's
        quantization simulated on its linear layers (ranges and the per-layer rule calibrated for this subnet)."""
        if self.calibration is None:
            return self.model
        plan = calibrate(lambda x: self.model(x, subnet), self.calibration, self.precision, self.max_error)
        return Simulated(self.model, plan)

    def static(self, model) -> float:
        """A trained static model's bits on the same windows, fp32 (what ``nas fit-accuracy`` fits a ranker to)."""
        return self.held(model, None).bits(model, None, self.batch_size, mixed_precision=False)

    def __call__(self, subnets: Sequence[Subnet]) -> np.ndarray:
        # fp32 even on a GPU: bf16 rounding would reorder subnets whose losses are close
        return np.array(
            [self.held(self.model, s).bits(self.scorer(s), s, self.batch_size, mixed_precision=False) for s in subnets],
            dtype=np.float64)


class HeldOutFitness:
    """``fitness(subnets)`` -> each subnet's mean bits per scored position over fixed held-out examples (a task's own:
    :class:`supernet.heldout.HeldOut`) with the supernet's weights, fp32: what a task of fixed-length examples searches
    with (``heldout`` gives :func:`separability` its per-example scores)."""

    def __init__(self, supernet, heldout, *, batch_size: int = 16, device: str = "cpu", description: dict | None = None,
                 summary: str = ""):
        self.model, self.heldout, self.batch_size = supernet.to(device).eval(), heldout, batch_size
        self.description = {"examples": int(len(heldout.x)), "tokens": heldout.tokens, **(description or {})}
        self.summary = summary or f"{len(heldout.x)} held-out examples"

    def scorer(self, subnet):
        return self.model

    def static(self, model) -> float:
        """A trained static model's bits on the same examples, fp32."""
        return self.heldout.bits(model, None, self.batch_size, mixed_precision=False)

    def __call__(self, subnets) -> np.ndarray:
        return np.array([self.heldout.bits(self.model, s, self.batch_size, mixed_precision=False) for s in subnets],
                        dtype=np.float64)


@dataclass(frozen=True)
class FitnessSettings:
    """How ``nas search`` (and ``nas fit-accuracy``) score a subnet with inherited weights: the scoring flags."""

    path: str | Path  # the supernet checkpoint (its folder holds the data cache unless ``data_cache``)
    seq_len: int = 128
    windows: int = 16  # held-out windows (a task's own examples: batches) per subnet
    batch_size: int = 16
    val_seed: int = 0
    device: str = "cpu"
    val_data: str | Path | None = None
    data_cache: str | Path | None = None
    precision: str = "fp32"


@dataclass(frozen=True)
class Scoring:
    """The held-out windows: the search's fitness defaults (``nas search --val-windows/--seq-len/--val-seed``)."""

    windows: int = 16
    seq_len: int = 128
    seed: int = 0
    batch_size: int = 16


def validation_bpb(
    model: Transformer, space: Space, tokens: np.ndarray, scoring: Scoring = Scoring(), where: str = "validation tokens",
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Bits per byte of ``model`` on fixed held-out windows: the number ``nas search`` reports as the subnet's loss
    (scored as the space's task scores, ``options`` its settings: a masked LM's bits per masked byte, the description
    says ``metric``)."""
    seq_len = min(scoring.seq_len, space.max_seq_len)
    score = InheritedLoss(StaticAsSupernet(model.eval(), space), tokens, seq_len=seq_len, windows=scoring.windows,
                          batch_size=scoring.batch_size, seed=scoring.seed, where=where, options=options)
    bpb = float(score([model.subnet])[0])
    return {"bits_per_byte": bpb, **score.description, "source": where}


def inherited_fitness(supernet_path: str | Path, model, payload: dict[str, Any], *, seq_len: int, windows: int,
                      batch_size: int, val_seed: int, device: str, val_data: str | Path | None = None,
                      data_cache: str | Path | None = None, precision: str = "fp32") -> tuple["InheritedLoss", str]:
    """The search's fitness of a one-stack supernet (``model``, loaded from ``supernet_path`` as ``payload``) and the
    digest of its held-out tokens: the windows that ``nas search`` and ``nas fit-accuracy`` score alike."""
    tokens, source = validation_tokens(supernet_path, payload, val_data=val_data, data_cache=data_cache)
    # scored as the supernet was trained (a masked LM: at its training mask rate, fixed masks of the seed)
    fitness = InheritedLoss(model, tokens, seq_len=seq_len, windows=windows, batch_size=batch_size, seed=val_seed,
                            device=device, where=source, precision=precision,
                            options=trained_options(model.space, payload.get("meta", {})))
    fitness.summary = f"{fitness.description['windows']} x {fitness.description['seq_len']} tokens of the {source}"
    return fitness, tokens_digest(tokens)


def tokens_digest(tokens: np.ndarray | Tokens) -> str:
    """16 hex digits of the held-out tokens (each vocabulary's in turn for a subword corpus)."""
    h = hashlib.sha256()
    for array in ([tokens.at(v) for v in tokens.sizes] if isinstance(tokens, Tokens) else [tokens]):
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:16]

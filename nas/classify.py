"""Fine-tune an exported encoder for text classification, and classify texts with the result.

:func:`finetune_classifier` is the library entry point behind ``nas finetune --task classify``;
:func:`load_classifier` and :meth:`Classifier.predict` behind ``nas classify``.

The model: an exported encoder (a one-stack ``Transformer`` whose task has bidirectional
attention) with a pooled head: the final hidden states (after the final norm) averaged over the
text's bytes, then one linear layer to the classes.  Mean pooling, not a [CLS]-style first byte:
the encoder was trained BERT-style on bytes without a class token, so no position carries a
summary of the sequence, while the mean sees every byte from the first step.

Padding: a text is its UTF-8 bytes, cut to ``seq_len`` (at most the model's ``max_seq_len``).  No
pad byte ever enters the encoder: :meth:`Classifier.logits` runs one forward pass per distinct
length in a batch.  That is exact for every attention type (a bidirectional token would otherwise
attend to the pads; a key mask would have to be written into each type, the kernel types included),
so a text's prediction does not depend on what it is batched with (``tests/nas/test_classify.py``).

Training: AdamW (decay on matrices and embeddings), warm-up + cosine (:class:`supernet.train.WarmupCosine`),
step ``k`` draws its batch from ``default_rng([seed, 0, k])`` over the training rows; the split is
scikit-learn's stratified ``train_test_split`` seeded by ``data_seed``.  Accuracy and macro-F1
(scikit-learn) on the validation rows before and after.  ``out/train/latest.pt`` (every
``ckpt_interval`` steps, on SIGINT / SIGTERM and at the end; ``torch.load(weights_only=True)``)
lets ``resume=True`` continue exactly: the resumed weights equal the uninterrupted run's.

Layout of ``out``: ``classifier.safetensors`` (the fine-tuned encoder under ``encoder.`` and the
head under ``head.``), ``labels.json`` (the class names, index = output row), ``classifier_card.json``
(written last: task classify, space, subnet, pooling, labels, the metrics, the data file's sha256,
the source model, the training settings, checksums) and ``train/`` (``latest.pt``, ``log.jsonl``).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from search_spaces import Space, Subnet, UserError
from supernet.artifact import CARD as MODEL_CARD
from supernet.files import atomic_save_tensors, atomic_write, atomic_write_json, remove_stale, sha256_file
from supernet.model import Transformer, TransformerConfig
from supernet.train import StepInfo, TrainConfig

log = logging.getLogger(__name__)

FORMAT = "nas-classifier"
VERSION = 1
CKPT_FORMAT = "nas-classify-checkpoint"
CARD = "classifier_card.json"
WEIGHTS = "classifier.safetensors"
LABELS = "labels.json"
RUN_DIR = "train"
LATEST = "latest.pt"
POOLING = "mean over the text's bytes of the final hidden states (after the final norm), then a linear layer"
OUTPUTS = (CARD, WEIGHTS, LABELS)
# Fine-tuning defaults (TrainConfig fields) of --task classify.
DEFAULTS = {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 20, "max_steps": 300, "batch_size": 16, "eval_interval": 100,
            "ckpt_interval": 100, "weight_decay": 0.01}
VAL_FRACTION = 0.2
# TrainConfig fields a resumed run may change (they bound or observe the run); seq_len is not one of them here.
RESUMABLE = ("max_steps", "max_time", "eval_interval", "ckpt_interval", "log_interval", "threads")


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class LabelledTexts:
    """The rows of a labelled CSV: texts (str), labels (str), the classes (sorted) and the file's sha256."""

    path: Path
    sha256: str
    texts: tuple[str, ...]
    labels: tuple[str, ...]
    classes: tuple[str, ...]
    text_column: str
    label_column: str

    def targets(self) -> np.ndarray:
        """Each row's class index (into ``classes``)."""
        index = {c: i for i, c in enumerate(self.classes)}
        return np.array([index[label] for label in self.labels], dtype=np.int64)


def read_csv_text(path: str | Path, flag: str = "--data") -> str:
    """The text of a UTF-8 CSV file (a BOM is dropped); one line naming the file for what it is not."""
    path = Path(path)
    if not path.is_file():  # a folder, a FIFO or a device is no CSV either, and says so (not "no such file")
        what = "a folder" if path.is_dir() else "not a regular file" if path.exists() else "no such file"
        raise UserError(f"{flag} {path}: {what} (expected a UTF-8 CSV file with a header row)")
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); {flag} expects a UTF-8 CSV "
                        "file") from None


def csv_rows(path: Path, text: str, needed: dict[str, str]) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """(header, [(line number, row)]) of CSV ``text``; ``needed`` maps each column that must exist to its flag."""
    # csv's default cap on a field (131,072 characters) is no limit of ours: a long text is cut to the model's window
    # (text_bytes), as the README says, not refused as "not valid CSV"; the cap is process-wide: set for this file's
    # reading, then put back
    before = csv.field_size_limit(max(csv.field_size_limit(), len(text) + 1))
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = reader.fieldnames
        if not header:
            raise UserError(f"{path}: empty; expected a CSV with a header row naming the columns "
                            f"({', '.join(map(repr, needed))}) and one row per text")
        missing = [f"{c!r} ({flag})" for c, flag in needed.items() if c not in header]
        if missing:
            raise UserError(f"{path}: no column {', '.join(missing)}; columns found: {', '.join(map(repr, header))}")
        rows = [(reader.line_num, row) for row in reader]
    except csv.Error as e:
        raise UserError(f"{path}: line {reader.line_num}: not valid CSV ({e})") from None
    finally:
        csv.field_size_limit(before)
    return list(header), rows


def read_labelled_csv(path: str | Path, text_column: str = "text", label_column: str = "label") -> LabelledTexts:
    """Read and check a labelled CSV: both columns present, no empty text or label, at least 2 classes, 2 rows each."""
    path = Path(path)
    text = read_csv_text(path)
    _, rows = csv_rows(path, text, {text_column: "--text-column", label_column: "--label-column"})
    if not rows:
        raise UserError(f"{path}: no rows under the header; expected labelled texts in columns {text_column!r} and "
                        f"{label_column!r}")
    texts, labels = [], []
    for line, row in rows:
        for column in (text_column, label_column):
            if not (row.get(column) or "").strip():
                raise UserError(f"{path}: line {line}: empty {'text' if column == text_column else 'label'} in column "
                                f"{column!r}")
        texts.append(row[text_column])
        labels.append(row[label_column].strip())
    classes, counts = np.unique(np.array(labels, dtype=object), return_counts=True)
    if len(classes) < 2:
        raise UserError(f"{path}: column {label_column!r} holds one class ({classes[0]!r} in {len(rows)} rows); "
                        "classification needs at least 2 classes")
    few = [f"{c!r} ({n} row)" for c, n in zip(classes, counts) if n < 2]
    if few:
        raise UserError(f"{path}: column {label_column!r}: class {', '.join(few)}; each class needs at least 2 rows (one for "
                        "training, one for validation)")
    return LabelledTexts(path, sha256_file(path), tuple(texts), tuple(labels), tuple(str(c) for c in classes), text_column,
                         label_column)


def split_rows(data: LabelledTexts, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, validation rows): scikit-learn's stratified ``train_test_split``, seeded."""
    from sklearn.model_selection import train_test_split

    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"--val-fraction: {val_fraction} is not between 0 and 1")
    n, k = len(data.texts), len(data.classes)
    n_val = math.ceil(val_fraction * n)  # scikit-learn's rounding of a float test_size
    if n_val < k or n - n_val < k:
        raise UserError(f"--val-fraction: {val_fraction} of {data.path}'s {n} rows leaves {n_val} for validation and "
                        f"{n - n_val} for training; each needs at least one row per class ({k} classes)")
    train, val = train_test_split(np.arange(n), test_size=val_fraction, random_state=seed, stratify=data.targets())
    return np.sort(train), np.sort(val)


def text_bytes(texts: list[str] | tuple[str, ...], seq_len: int) -> list[bytes]:
    """Each text's UTF-8 bytes, cut to ``seq_len``; an empty text becomes one space (the mean needs a byte)."""
    return [t.encode("utf-8")[:seq_len] or b" " for t in texts]


# --------------------------------------------------------------------------- the model


def check_encoder(card: Path, space: Space) -> None:
    """Refuse a model that is not a byte-level encoder (bidirectional attention); ``card`` names the file in the message."""
    from search_spaces import tasks

    if space.causal:
        raise UserError(f"{card}: a {space.task} model (space {space.name!r}: causal attention); "
                        f"--task classify needs an encoder (a model of a task: {tasks.with_form('bidirectional')} space)")
    if space.vocab_size < 256:
        raise UserError(f"{card}: vocab_size {space.vocab_size}; --task classify reads texts as bytes "
                        "(vocab_size 256 or more)")


class Classifier(nn.Module):
    """An encoder with a mean-pooled linear head: ``logits(texts)`` -> (B, classes)."""

    def __init__(self, encoder: Transformer, n_classes: int, generator: torch.Generator | None = None):
        super().__init__()
        assert not encoder.config.causal, "a classifier pools a bidirectional encoder"
        self.encoder = encoder
        self.head = nn.Linear(encoder.config.embed_dim, n_classes)
        nn.init.normal_(self.head.weight, mean=0.0, std=0.02, generator=generator)
        nn.init.zeros_(self.head.bias)

    def forward(self, idx: Tensor) -> Tensor:
        """idx (B, T) bytes of B texts of one length T (no padding) -> logits (B, classes)."""
        h = self.encoder.hidden(idx)  # (B, T, E)
        h = F.layer_norm(h, (h.shape[-1],), self.encoder.ln_f.weight, self.encoder.ln_f.bias)
        return self.head(h.mean(1))  # (B, C)

    def logits(self, texts: list[bytes]) -> Tensor:
        """Logits (B, classes) of texts of any lengths: one forward pass per distinct length, no pad byte."""
        device = self.head.weight.device
        by_length: dict[int, list[int]] = {}
        for i, t in enumerate(texts):
            by_length.setdefault(len(t), []).append(i)
        parts, order = [], []
        for rows in by_length.values():
            idx = torch.tensor([list(texts[i]) for i in rows], dtype=torch.long, device=device)  # (b, T)
            parts.append(self(idx))
            order.extend(rows)
        out = torch.cat(parts)  # (B, C) in group order
        return out[torch.as_tensor(np.argsort(order), device=device)]

    @torch.no_grad()
    def predict(self, texts: list[bytes], batch_size: int = 64) -> np.ndarray:
        """Class indices (B,) of ``texts``."""
        return predict_logits(self, texts, batch_size).argmax(1)


def predict_logits(model: Classifier, texts: list[bytes], batch_size: int = 64) -> np.ndarray:
    """Logits (B, classes) of ``texts`` in eval mode, ``batch_size`` texts at a time."""
    was = model.training
    model.eval()
    with torch.no_grad():
        out = [model.logits(texts[i:i + batch_size]).float().cpu().numpy() for i in range(0, len(texts), batch_size)]
    model.train(was)
    return np.concatenate(out) if out else np.zeros((0, model.head.out_features), dtype=np.float32)


def scores(model: Classifier, texts: list[bytes], targets: np.ndarray) -> dict[str, float]:
    """Accuracy and macro-F1 (scikit-learn) of ``model`` on ``texts``; the mean cross-entropy (nats)."""
    from sklearn.metrics import accuracy_score, f1_score

    logits = predict_logits(model, texts)
    loss = float(F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(targets)))
    predicted = logits.argmax(1)
    labels = list(range(model.head.out_features))
    return {"accuracy": float(accuracy_score(targets, predicted)),
            "macro_f1": float(f1_score(targets, predicted, labels=labels, average="macro", zero_division=0)),
            "loss": loss, "rows": int(len(targets))}


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class ClassifyTraining:
    """What one fine-tuning run for classification does.

    ``model``: an exported encoder (``nas export``'s layout); ``data``: a UTF-8 CSV with a text and
    a label column.  ``config.seq_len``: bytes kept per text (None in :data:`DEFAULTS`: the model's
    ``max_seq_len``); ``config.eval_batches`` is unused (the whole validation split is scored).
    ``resume`` continues ``out/train/latest.pt`` exactly; only :data:`RESUMABLE` and ``device`` may change.
    """

    model: Path
    data: Path
    out: Path
    text_column: str = "text"
    label_column: str = "label"
    config: TrainConfig = TrainConfig(**DEFAULTS)
    data_seed: int = 0
    val_fraction: float = VAL_FRACTION
    resume: bool = False
    device: str = "cpu"

    def record(self) -> dict[str, Any]:
        return {"model": str(Path(self.model).resolve()), "data": str(Path(self.data).resolve()), "text_column": self.text_column,
                "label_column": self.label_column, "config": self.config.to_dict(), "data_seed": self.data_seed,
                "val_fraction": self.val_fraction, "device": self.device}

    @classmethod
    def from_record(cls, r: dict[str, Any], out: Path) -> "ClassifyTraining":
        return cls(model=Path(r["model"]), data=Path(r["data"]), out=out, text_column=r["text_column"],
                   label_column=r["label_column"], config=TrainConfig.from_dict(r["config"]), data_seed=r["data_seed"],
                   val_fraction=r["val_fraction"], resume=True, device=r["device"])


@dataclass(frozen=True)
class ClassifyResult:
    out: Path
    steps: int
    seconds: float
    before: dict[str, float]
    after: dict[str, float]
    classes: tuple[str, ...]
    train_rows: int
    val_rows: int
    stopped: str


class ClassifyInterrupted(KeyboardInterrupt):
    """SIGINT / SIGTERM stopped the run after a whole step; its state is in ``checkpoint``."""

    def __init__(self, step: int, checkpoint: Path):
        super().__init__(f"interrupted at step {step}; saved {checkpoint}")
        self.step, self.checkpoint = step, checkpoint


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A classification run's checkpoint (``weights_only``), checked for its format marker."""
    from supernet.checkpoint import load_marked

    if not path.is_file():
        raise UserError(f"--resume: {path.parent.parent} holds no checkpoint ({RUN_DIR}/{LATEST}); start a new run without "
                        "--resume")
    return load_marked(path, CKPT_FORMAT, "classification training checkpoint")


def stored_settings(out: str | Path) -> ClassifyTraining:
    """The settings of the run in ``out`` (from ``out/train/latest.pt``), with ``resume=True``."""
    out = Path(out)
    return ClassifyTraining.from_record(read_checkpoint(out / RUN_DIR / LATEST)["settings"], out)


def _check_resumed(s: ClassifyTraining, stored: ClassifyTraining, flags: dict[str, str]) -> None:
    """Refuse a resumed run whose settings differ from the stored ones outside :data:`RESUMABLE` (naming the flag)."""
    a, b = s.record(), stored.record()
    a_cfg, b_cfg = a.pop("config"), b.pop("config")
    a.pop("device"), b.pop("device")
    changed = [(k, a[k], b[k]) for k in a if a[k] != b[k]]
    changed += [(k, a_cfg[k], b_cfg.get(k)) for k in a_cfg if k not in RESUMABLE and a_cfg[k] != b_cfg.get(k)]
    if changed:
        k, given, kept = changed[0]
        raise UserError(f"{flags.get(k, k)}: a resumed run keeps its value ({kept}); got {given}")


# --------------------------------------------------------------------------- training


def load_encoder(model_dir: Path) -> tuple[Transformer, Space, dict[str, Any]]:
    """The exported encoder of ``model_dir``, its space and its card (a causal model is refused)."""
    from supernet.artifact import card_space, load_model, read_card

    card = read_card(model_dir)
    space = card_space(model_dir, card)
    check_encoder(model_dir / MODEL_CARD, space)
    return load_model(model_dir), space, card


def _state(model: Classifier, optimizer: torch.optim.Optimizer, s: ClassifyTraining, step: int, elapsed: float,
           before: dict[str, float], sha256: dict[str, str], stopped: str | None) -> dict[str, Any]:
    """The checkpoint's payload (tensors, numbers, strings: it loads with ``weights_only=True``)."""
    return {"format": CKPT_FORMAT, "version": VERSION, "settings": s.record(), **sha256,
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()}, "optimizer": optimizer.state_dict(),
            "rng": torch.get_rng_state(), "step": step, "elapsed": elapsed, "before": before, "stopped": stopped}


def _save(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: torch.save(state, f))


def finetune_classifier(
    s: ClassifyTraining,
    progress: Callable[[StepInfo], None] | None = None,
    flags: dict[str, str] | None = None,
) -> ClassifyResult:
    """Fine-tune the encoder of ``s.model`` with a pooled head on ``s.data``; write ``s.out`` (see the module doc).

    Every input is checked before anything is written.  ``flags`` names the flag of each setting in messages.
    """
    from supernet.train import JsonlLog, WarmupCosine, _catch_interrupts, param_groups, use_threads

    flags = flags or {}
    model_dir, out = Path(s.model), Path(s.out)
    if model_dir.resolve() == out.resolve():
        raise UserError(f"--out {out}: is the source model directory; choose a new directory")
    latest = out / RUN_DIR / LATEST
    stored = None
    if s.resume:
        stored = read_checkpoint(latest)
        _check_resumed(s, ClassifyTraining.from_record(stored["settings"], out), flags)
    elif latest.exists():
        raise UserError(f"--out {out}: already holds a training run ({RUN_DIR}/{LATEST}); add --resume to continue it, or "
                        "choose another --out")
    encoder, space, card = load_encoder(model_dir)
    model_sha = sha256_file(model_dir / MODEL_CARD)  # the card holds the weights' checksum
    if stored is not None and stored["model_sha256"] != model_sha:
        raise UserError(f"{model_dir / MODEL_CARD}: changed since the run started (sha256 {model_sha[:12]}..., the run's "
                        f"{stored['model_sha256'][:12]}...); a resumed run fine-tunes the same model")
    data = read_labelled_csv(s.data, s.text_column, s.label_column)
    if stored is not None and stored["data_sha256"] != data.sha256:
        raise UserError(f"{data.path}: changed since the run started (sha256 {data.sha256[:12]}..., the run's "
                        f"{stored['data_sha256'][:12]}...); a resumed run trains on the same rows")
    config = s.config
    if config.seq_len > space.max_seq_len:
        raise UserError(f"--seq-len: {config.seq_len} exceeds the model's max_seq_len {space.max_seq_len}")
    seq_len = config.seq_len
    train_rows, val_rows = split_rows(data, s.val_fraction, s.data_seed)
    targets = data.targets()
    texts = text_bytes(data.texts, seq_len)
    val_texts, val_targets = [texts[i] for i in val_rows], targets[val_rows]

    use_threads(config, stored["settings"]["config"] if stored is not None else None, log.info)  # before any sum
    device = torch.device(s.device)
    torch.manual_seed(config.seed)
    model = Classifier(encoder, len(data.classes), generator=torch.Generator().manual_seed(config.seed)).to(device)
    optimizer = torch.optim.AdamW(param_groups(model, config.weight_decay), lr=config.lr, betas=(config.beta1, config.beta2))
    schedule = WarmupCosine.from_config(config)
    step, elapsed = 0, 0.0
    if stored is not None:
        model.load_state_dict(stored["model"])
        optimizer.load_state_dict(stored["optimizer"])
        torch.set_rng_state(stored["rng"])
        step, elapsed, before = stored["step"], stored["elapsed"], stored["before"]
        log.info("resumed %s at step %d", latest, step)
    else:
        before = scores(model, val_texts, val_targets)
    jsonl = JsonlLog(out / RUN_DIR / "log.jsonl", resume_step=step if stored is not None else None)
    if stored is None:
        jsonl.write("eval", step=0, **before)

    def done() -> str | None:
        if config.max_steps is not None and step >= config.max_steps:
            return "max_steps"
        if config.max_time is not None and elapsed >= config.max_time:
            return "max_time"
        return None

    def save(stopped: str | None) -> None:
        sha256 = {"data_sha256": data.sha256, "model_sha256": model_sha}
        _save(latest, _state(model, optimizer, s, step, elapsed, before, sha256, stopped))

    model.train()
    seen, started = 0, elapsed  # bytes trained on in this process, for the progress bar's rate
    with _catch_interrupts() as interrupt:
        while done() is None:
            t0 = time.perf_counter()
            rng = np.random.default_rng([config.seed, 0, step])
            batch = rng.choice(train_rows, size=config.batch_size, replace=len(train_rows) < config.batch_size)
            lr = schedule(step, elapsed)
            for group in optimizer.param_groups:
                group["lr"] = lr
            logits = model.logits([texts[i] for i in batch])  # (B, C)
            loss = F.cross_entropy(logits, torch.as_tensor(targets[batch], device=device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            step += 1
            elapsed += time.perf_counter() - t0
            if step % config.log_interval == 0:
                jsonl.write("train", step=step, loss=loss.item(), lr=lr)
            if step % config.eval_interval == 0 and done() is None:
                jsonl.write("eval", step=step, **scores(model, val_texts, val_targets))
            seen += sum(len(texts[i]) for i in batch)
            if progress is not None:  # tokens_per_s: bytes per second of this process's steps
                progress(StepInfo(step, config.max_steps, elapsed, config.max_time, lr, {"classify": loss.item()}, (),
                                  seen / max(elapsed - started, 1e-9), "nats/text"))
            if interrupt.requested:
                save("interrupted")
                raise ClassifyInterrupted(step, latest)
            if step % config.ckpt_interval == 0:
                save(None)
    stopped = done() or "max_steps"
    save(stopped)
    after = scores(model, val_texts, val_targets)
    jsonl.write("eval", step=step, **after)
    info = {"task": "classify", "pooling": POOLING, "labels": list(data.classes), "seq_len": seq_len,
            "validation": {"before": before, "after": after, "rows": int(len(val_rows)), "split": "stratified "
                           f"train_test_split(test_size={s.val_fraction}, random_state={s.data_seed})"},
            "data": {"file": str(data.path.resolve()), "sha256": data.sha256, "rows": len(data.texts),
                     "train_rows": int(len(train_rows)), "text_column": data.text_column, "label_column": data.label_column},
            "source_model": {"dir": str(model_dir.resolve()), "card_sha256": model_sha,
                             "space": space.name, "subnet": card["subnet"]},
            "training": {"steps": step, "stopped": stopped, "seconds": elapsed, "config": config.to_dict(),
                         "data_seed": s.data_seed, "val_fraction": s.val_fraction, "torch": str(torch.__version__)}}
    write_classifier(model, space, data.classes, out, info)
    return ClassifyResult(out, step, elapsed, before, after, data.classes, len(train_rows), len(val_rows), stopped)


# --------------------------------------------------------------------------- the classifier folder


def write_classifier(model: Classifier, space: Space, classes: tuple[str, ...], out: Path, info: dict[str, Any]) -> Path:
    """Write weights, labels and the card (last) of ``model`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    remove_stale(out, OUTPUTS)  # the card first: a folder is never described by an older card
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_save_tensors(out / WEIGHTS, state, metadata={"format": FORMAT})
    atomic_write_json(out / LABELS, list(classes))
    card = {"format": FORMAT, "version": VERSION, **info, "space": space.to_dict(), "subnet": model.encoder.subnet.to_dict(),
            "parameters": sum(p.numel() for p in model.parameters()),
            "files": {name: sha256_file(out / name) for name in (WEIGHTS, LABELS)}}
    atomic_write_json(out / CARD, card, sort_keys=False)
    return out / CARD


def load_classifier(folder: str | Path, device: str = "cpu") -> tuple[Classifier, tuple[str, ...], dict[str, Any]]:
    """(classifier in eval mode, class names, card) of a folder written by :func:`finetune_classifier`."""
    import yaml
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from search_spaces import parse_space
    from supernet.artifact import fitting_model
    from supernet.files import check_part

    folder = Path(folder)
    path = folder / CARD
    if not folder.is_dir():
        raise UserError(f"--model {folder}: no such directory (expected the output of `nas finetune --task classify`)")
    try:
        card = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: missing; {folder} is not a classifier written by `nas finetune --task classify`") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(card, dict) or card.get("format") != FORMAT or card.get("version") != VERSION:
        raise UserError(f"{path}: not a classifier card of this tool (format {FORMAT!r} version {VERSION})")
    files = card.get("files") or {}
    for name in (WEIGHTS, LABELS):
        if name not in files:
            raise UserError(f"{path}: lists no checksum for {name}")
        check_part(folder, name, files[name], "the classifier card")
    missing = [k for k in ("space", "subnet", "seq_len") if k not in card]
    if missing:
        raise UserError(f"{path}: missing field {missing[0]!r}")
    space = parse_space(yaml.safe_dump(card["space"]), where=f"{CARD}[space]", source=str(path))
    check_encoder(path, space)
    subnet = Subnet.from_dict(card["subnet"], where=f"{CARD}[subnet]")
    classes = tuple(json.loads((folder / LABELS).read_text()))
    config = TransformerConfig.from_subnet(space, subnet)
    model = fitting_model(folder / WEIGHTS, lambda: Classifier(Transformer(config), len(classes)), path)  # (the card's claim)
    try:
        model.load_state_dict(load_file(str(folder / WEIGHTS)))
    except (SafetensorError, RuntimeError) as e:
        raise UserError(f"{folder / WEIGHTS}: weights do not match the card: {str(e).splitlines()[0]}") from None
    return model.to(device).eval(), classes, card

"""An exported encoder-decoder: a static :class:`~tasks.translation.model.Seq2SeqTransformer` that loads without the supernet.

The layout and checks of :mod:`supernet.artifact` (``model.safetensors``, ``subnet.yaml``, ``model_card.json``
with the format marker, the full space, the subnet, the parameter count and the checksums, written last);
the card says ``task: seq2seq`` and carries the corpus the model was trained on (so ``nas translate --eval``
can score it on that corpus's test split, hash checked) and what was measured (held-out cross-entropy per
target byte; chrF / BLEU once ``nas translate --eval`` has run).  ``nas export`` adds the ONNX graphs of the
encoder and the decoder step (:mod:`tasks.translation.onnx`) and lists them in the card.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from supernet.artifact import (
    CARD,
    FORMAT,
    OUTPUTS,
    SUBNET,
    TOKENIZER,
    VERSION,
    WEIGHTS,
    fitting_model,
    load_weights,
    open_export,
    read_card,
    write_json_atomic,
)
from supernet.files import atomic_save_tensors, atomic_write, remove_stale, sha256_file

from .model import Seq2SeqTransformer
from .space import Seq2SeqSubnet


def save_seq2seq_model(model: Seq2SeqTransformer, out: str | Path, card: dict[str, Any] | None = None,
                       tokenizer: str | None = None) -> Path:
    """Write weights, subnet, ``tokenizer.json`` and model card of ``model`` into directory ``out``; return the card
    path.  ``tokenizer``: the text of the joint vocabulary's file (None: the bytes with PAD, BOS and EOS)."""
    from supernet.tokenizer import Vocabulary, byte_tokenizer_json

    from .data import SPECIAL_NAMES, VOCAB_SIZE

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale(out, (CARD, SUBNET, *OUTPUTS))
    vocab = Vocabulary(tokenizer if tokenizer is not None else byte_tokenizer_json(VOCAB_SIZE, SPECIAL_NAMES))
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_save_tensors(out / WEIGHTS, state, metadata={"format": FORMAT})
    atomic_write(out / SUBNET, model.subnet.to_yaml())
    atomic_write(out / TOKENIZER, vocab.text.encode("utf-8"))
    full = {
        "format": FORMAT,
        "version": VERSION,
        "task": "seq2seq",
        "space": model.space.to_dict(),
        "subnet": model.subnet.to_dict(),
        "parameters": model.num_params(),
        "tokenizer": {"file": TOKENIZER, "kind": vocab.kind, "vocab": vocab.size, "sha256": vocab.sha256,
                      "metadata": vocab.metadata()},
        "files": {WEIGHTS: sha256_file(out / WEIGHTS), TOKENIZER: sha256_file(out / TOKENIZER)},
        **(card or {}),
    }
    write_json_atomic(out / CARD, full)
    return out / CARD


def is_seq2seq_export(model_dir: str | Path) -> bool:
    path = Path(model_dir) / CARD
    return path.is_file() and read_card(model_dir).get("task") == "seq2seq"


def load_seq2seq_model(model_dir: str | Path, device: str | torch.device = "cpu") -> tuple[Seq2SeqTransformer, dict]:
    """Load an exported encoder-decoder (eval mode) and its card; the checks of :func:`supernet.artifact.load_model`."""
    card, weights, space, subnet = open_export(model_dir, Seq2SeqSubnet)
    model = fitting_model(weights, lambda: Seq2SeqTransformer(space, subnet), Path(model_dir) / CARD)  # (a card's claim)
    load_weights(model, weights)
    return model.to(device).eval(), card

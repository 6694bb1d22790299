"""An exported encoder-decoder: a static :class:`~supernet.seq2seq.Seq2SeqTransformer` that loads without the supernet.

The layout and checks of :mod:`supernet.artifact` (``model.safetensors``, ``subnet.yaml``, ``model_card.json``
with the format marker, the full space, the subnet, the parameter count and the checksums, written last);
the card says ``task: seq2seq`` and carries the corpus the model was trained on (so ``nas translate --eval``
can score it on that corpus's test split, hash checked) and what was measured (held-out cross-entropy per
target byte; chrF / BLEU once ``nas translate --eval`` has run).  ONNX graphs of the encoder and the decoder
step are still to come.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from search_spaces import UserError
from search_spaces.seq2seq import Seq2SeqSpace, Seq2SeqSubnet

from .artifact import CARD, FORMAT, OUTPUTS, SUBNET, VERSION, WEIGHTS, card_space, read_card, verify_file, write_json_atomic
from .files import atomic_write, check_parts, remove_stale, sha256_file
from .seq2seq import Seq2SeqTransformer


def save_seq2seq_model(model: Seq2SeqTransformer, out: str | Path, card: dict[str, Any] | None = None) -> Path:
    """Write weights, subnet and model card of ``model`` into directory ``out``; return the card path."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale(out, (CARD, SUBNET, *OUTPUTS))
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out / WEIGHTS), metadata={"format": FORMAT})
    atomic_write(out / SUBNET, model.subnet.to_yaml())
    full = {
        "format": FORMAT,
        "version": VERSION,
        "task": "seq2seq",
        "space": model.space.to_dict(),
        "subnet": model.subnet.to_dict(),
        "parameters": model.num_params(),
        "files": {WEIGHTS: sha256_file(out / WEIGHTS)},
        **(card or {}),
    }
    write_json_atomic(out / CARD, full)
    return out / CARD


def is_seq2seq_export(model_dir: str | Path) -> bool:
    path = Path(model_dir) / CARD
    return path.is_file() and read_card(model_dir).get("task") == "seq2seq"


def load_seq2seq_model(model_dir: str | Path, device: str | torch.device = "cpu") -> tuple[Seq2SeqTransformer, dict]:
    """Load an exported encoder-decoder (eval mode) and its card; checks as :func:`supernet.artifact.load_model`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    card = read_card(model_dir)
    weights = verify_file(model_dir, WEIGHTS, card)
    check_parts(model_dir, card.get("files") or {}, model_dir / CARD, OUTPUTS)
    space = card_space(model_dir, card)
    if not isinstance(space, Seq2SeqSpace):
        raise UserError(f"{model_dir / CARD}: a {space.task} model, not an encoder-decoder (task seq2seq)")
    try:
        subnet = Seq2SeqSubnet.from_dict(card["subnet"], where=f"{CARD}[subnet]")
    except KeyError as e:
        raise UserError(f"{model_dir / CARD}: missing field {e}") from None
    model = Seq2SeqTransformer(space, subnet)
    try:
        state = load_file(str(weights))
    except SafetensorError as e:
        raise UserError(f"{weights}: not a readable safetensors file ({e})") from None
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"{weights}: weights do not match the subnet in the model card: {str(e).splitlines()[0]}") from None
    return model.to(device).eval(), card

"""An exported model directory: a static Transformer that loads without the supernet.

Layout of ``DIR``::

    model.safetensors   weights of the static Transformer (safetensors: loading runs no code)
    subnet.yaml         the architecture (a Subnet)
    model_card.json     format marker, space (full), subnet, parameters, file checksums, and
                        whatever the exporter measured (bits per byte, predicted / measured latency)
    README.md           a Hugging Face model card rendered from model_card.json (front matter, prose)
    config.json         the architecture, Hugging Face style (generation_config.json: a causal LM)
    model.onnx          (optional) the ONNX graph, written by ``nas export``
    model.pt2           (optional) a ``torch.export`` program: plain torch, no ``nas`` needed
                        (``torch.export.load("model.pt2").module()``), dynamic batch and length

The card is written by :func:`write_card`, which writes README.md and config.json from it each time
(:mod:`supernet.model_folder`, what the space's task says: :meth:`tasks.base.Task.card_facts`): they describe the
folder and are not loaded.  A card holds names and digests, never a path of the machine that wrote it or its host
name.  ``load_model(DIR)`` is the one-line loader; it checks the card's format, the checksums and the
shapes, and names the file in every error.  ``load_program(DIR)`` loads ``model.pt2`` after
checking its checksum and that nothing in it would be unpickled (``torch.export.load`` falls
back to ``torch.load(weights_only=False)`` for pickled entries, which can run code).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import yaml

from search_spaces import Space, Subnet, UserError, parse_space, tasks

from .files import (atomic_save_tensors, atomic_write, atomic_write_json, check_part, check_parts, remove_stale, sha256_file,
                    temp_file)
from .model import Transformer, TransformerConfig
from .model_folder import FILES as DESCRIPTIONS
from .model_folder import write_folder_files

FORMAT = "nas-exported-model"
VERSION = 1
WEIGHTS = "model.safetensors"
CARD = "model_card.json"
SUBNET = "subnet.yaml"
PROGRAM = "model.pt2"
MAX_BATCH = 4096


# Every file an export run writes (the card last); a run removes them all before writing its own, and loading
# refuses one that lies in the folder without a checksum in the card (left by an earlier or interrupted run).
OUTPUTS = (WEIGHTS, PROGRAM, "model.onnx", "model.onnx.data", "step.onnx", "step.onnx.data")


def write_json_atomic(path: Path, data: Any) -> None:
    atomic_write_json(path, data, sort_keys=False)


def write_card(out: str | Path, card: dict[str, Any]) -> Path:
    """Write ``model_card.json`` into ``out``, then README.md and config.json from it (:func:`describe`)."""
    out = Path(out)
    write_json_atomic(out / CARD, card)
    describe(out, card)
    return out / CARD


def describe(out: str | Path, card: dict[str, Any] | None = None) -> None:
    """Write the files that describe a model folder from its card: README.md, config.json (and a causal LM's
    generation_config.json), as the space's task says (:meth:`tasks.base.Task.card_facts`)."""
    out = Path(out)
    card = card or read_card(out)
    space = card_space(out, card)
    subnet = space.subnet_type.from_dict(card["subnet"], where=f"{CARD}[subnet]")
    facts = tasks.of(space).card_facts(space, subnet, card)
    write_folder_files(out, {**card, "subnet_key": subnet.key, "space_hash": space.hash}, facts)


def save_model(model: Transformer, out: str | Path, space: Space, card: dict[str, Any] | None = None) -> Path:
    """Write weights, subnet and model card of ``model`` into directory ``out``; return the card path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale(out, (CARD, SUBNET, *DESCRIPTIONS, *OUTPUTS))  # the card first: never described by an older card
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_save_tensors(out / WEIGHTS, state, metadata={"format": FORMAT})
    subnet = model.subnet
    atomic_write(out / SUBNET, subnet.to_yaml())
    full = {
        "format": FORMAT,
        "version": VERSION,
        "space": space.to_dict(),
        "subnet": subnet.to_dict(),
        "parameters": model.num_params(),
        "files": {WEIGHTS: sha256_file(out / WEIGHTS)},
        **(card or {}),
    }
    return write_card(out, full)


def update_card(out: str | Path, **fields: Any) -> dict[str, Any]:
    """Add fields (and, for ``files``, checksums) to an existing card."""
    out = Path(out)
    card = read_card(out)
    files = fields.pop("files", None) or []
    for name in files:
        card["files"][name] = sha256_file(out / name)
    card.update(fields)
    write_card(out, card)
    return card


def read_card(model_dir: str | Path) -> dict[str, Any]:
    model_dir = Path(model_dir)
    path = model_dir / CARD
    if not model_dir.is_dir():
        raise UserError(f"{model_dir}: no such model directory (expected the output of `nas export`)")
    try:
        card = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: missing; {model_dir} is not a model exported by `nas export`") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(card, dict) or card.get("format") != FORMAT:
        raise UserError(f"{path}: not a model card of this tool (no '{FORMAT}' format marker)")
    if card.get("version") != VERSION:
        raise UserError(f"{path}: model card version {card.get('version')!r}, this tool reads version {VERSION}")
    return card


def verify_file(model_dir: str | Path, name: str, card: dict[str, Any] | None = None) -> Path:
    """Check ``name`` against the checksum in the card (a tampered or swapped file is refused)."""
    model_dir = Path(model_dir)
    card = card or read_card(model_dir)
    expected = card.get("files", {}).get(name)
    if expected is None:
        raise UserError(f"{model_dir / CARD}: lists no checksum for {name}")
    return check_part(model_dir, name, expected, "the model card")


def card_space(model_dir: str | Path, card: dict[str, Any] | None = None) -> Space:
    """The search space stored in a model's card."""
    model_dir = Path(model_dir)
    card = card or read_card(model_dir)
    if "space" not in card:
        raise UserError(f"{model_dir / CARD}: missing field 'space'")
    return parse_space(yaml.safe_dump(card["space"]), where=f"{CARD}[space]", source=str(model_dir / CARD))


def open_export(model_dir: str | Path, subnet_type: type = Subnet) -> tuple[dict[str, Any], Path, Space, Any]:
    """The card, the checked weights file, the space and the subnet of an exported model (every check of loading)."""
    model_dir = Path(model_dir)
    card = read_card(model_dir)
    weights = verify_file(model_dir, WEIGHTS, card)
    check_parts(model_dir, card.get("files") or {}, model_dir / CARD, OUTPUTS)
    space = card_space(model_dir, card)
    if space.subnet_type is not subnet_type:
        raise UserError(f"{model_dir / CARD}: a model of task {space.task}, not what this loader reads")
    try:
        subnet = subnet_type.from_dict(card["subnet"], where=f"{CARD}[subnet]")
    except KeyError as e:
        raise UserError(f"{model_dir / CARD}: missing field {e}") from None
    return card, weights, space, subnet


def load_weights(model: torch.nn.Module, weights: Path) -> None:
    """Fill ``model`` from a safetensors file; one line naming the file when it is unreadable or does not fit."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(weights))
    except SafetensorError as e:
        raise UserError(f"{weights}: not a readable safetensors file ({e})") from None
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"{weights}: weights do not match the subnet in the model card: {str(e).splitlines()[0]}") from None


def load_model(model_dir: str | Path, device: str | torch.device = "cpu") -> Transformer:
    """Load an exported model (eval mode): ``model = supernet.load_model("out/")``."""
    _, weights, space, subnet = open_export(model_dir)
    model = Transformer(TransformerConfig.from_subnet(space, subnet))
    load_weights(model, weights)
    return model.to(device).eval()


# --------------------------------------------------------------------------- the torch.export program


def export_program(model: Transformer, path: str | Path) -> Path:
    """Write ``model`` as a ``torch.export`` program with dynamic batch and sequence axes.

    Traced at (2, max_seq_len) like the ONNX export; every attention type takes its traceable
    path (sparse types one masked SDPA, the linear family its chunked form with an unbacked
    chunk count), so the program serves every batch up to 4096 and every length up to max_seq_len.
    """
    import warnings

    path = Path(path)
    model = model.eval()
    example = torch.zeros(2, model.config.max_seq_len, dtype=torch.long)  # (B, T)
    batch = torch.export.Dim("batch", max=MAX_BATCH)
    seq = torch.export.Dim("seq", max=model.config.max_seq_len)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, (example,), dynamic_shapes=({0: batch, 1: seq},))
        for node in program.graph.nodes:  # the source lines it was traced from: this machine's paths
            node.meta.pop("stack_trace", None)
        fd, tmp = temp_file(path, ".pt2")  # the mode of a file open() makes, not mkstemp's 0600
        os.close(fd)
        try:
            torch.export.save(program, tmp)  # (warns that the tied embedding / head weight is one tensor: it is)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return path


def check_program(path: str | Path) -> None:
    """Refuse a ``.pt2`` archive that ``torch.export.load`` would unpickle anything from.

    Safe entries: weights and constants stored as raw bytes (``use_pickle: false``) and sample
    inputs that load under ``torch.load(weights_only=True)``; anything else (pickled tensors,
    script objects, custom objects) is refused before ``torch.export.load`` sees the file.
    """
    import io
    import zipfile

    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            configs = [n for n in names if n.endswith(("_weights_config.json", "_constants_config.json"))]
            for name in configs:
                entries = json.loads(z.read(name)).get("config", {})
                pickled = sorted(k for k, v in entries.items() if v.get("use_pickle", True))
                if pickled:
                    raise UserError(
                        f"{path}: holds pickled entries ({', '.join(pickled[:3])}); loading them could run code, refused"
                    )
            objects = [
                n for n in names if "/data/constants/" in n and n.rsplit("/", 1)[-1].startswith(("custom_obj", "torchbind"))
            ]
            if objects:
                raise UserError(f"{path}: holds script/custom objects ({objects[0]}); loading them could run code, refused")
            for name in (n for n in names if "/sample_inputs/" in n):
                torch.load(io.BytesIO(z.read(name)), weights_only=True)
    except (zipfile.BadZipFile, json.JSONDecodeError, KeyError) as e:
        raise UserError(f"{path}: not a readable torch.export archive ({type(e).__name__}: {e})") from None
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - torch.load refusing a pickle, a truncated member, ...
        raise UserError(
            f"{path}: an entry needs more than weights to load ({type(e).__name__}: {str(e).splitlines()[0][:160]}); refused"
        ) from None
    if not configs:
        raise UserError(f"{path}: not a torch.export archive (no weights or constants config)")


def load_program(model_dir: str | Path) -> torch.nn.Module:
    """The exported program of ``model_dir`` as a plain ``nn.Module`` (checksum and pickle checks first)."""
    model_dir = Path(model_dir)
    path = verify_file(model_dir, PROGRAM)
    check_program(path)
    try:
        return torch.export.load(str(path)).module()
    except Exception as e:  # noqa: BLE001 - a version mismatch or a corrupt graph
        raise UserError(f"{path}: torch.export.load failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None

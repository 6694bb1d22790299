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
    tokenizer.json      the vocabulary the model reads (Hugging Face ``tokenizers``' format; a byte model's maps each
                        byte to its id), named by its sha256 in the card and in the ONNX metadata (``nas.tokenizer``)

The card is written by :func:`write_card`, which writes README.md and config.json from it each time
(:mod:`supernet.model_folder`, what the space's task says: :meth:`tasks.base.Task.card_facts`): they describe the
folder and are not loaded.  A card holds names and digests, never a path of the machine that wrote it or its host
name.  ``load_model(DIR)`` is the one-line loader; it checks the card's format, the checksums and the
shapes, and names the file in every error.  ``load_program(DIR)`` loads ``model.pt2`` after
checking its checksum and the archive entry by entry (:func:`check_program`): ``torch.export.load``
falls back to ``torch.load(weights_only=False)`` for legacy and pickled entries and unpickles opaque
objects, which can run code, so an archive holding any entry a safe program does not have is refused.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

from search_spaces import Space, Subnet, UserError, parse_space, tasks
from search_spaces.errors import first_line, shown

from .files import (atomic_save_tensors, atomic_write, atomic_write_json, check_part, check_parts, remove_stale, sha256_file,
                    temp_file)
from .model import Transformer, TransformerConfig
from .model_folder import FILES as DESCRIPTIONS
from .model_folder import write_folder_files
from .tokenizer import BYTES, FILE, Vocabulary, byte_tokenizer_json, read_vocabulary

FORMAT = "nas-exported-model"
VERSION = 1
WEIGHTS = "model.safetensors"
CARD = "model_card.json"
SUBNET = "subnet.yaml"
PROGRAM = "model.pt2"
TOKENIZER = FILE  # tokenizer.json
MAX_BATCH = 4096


# Every file an export run writes (the card last); a run removes them all before writing its own, and loading
# refuses one that lies in the folder without a checksum in the card (left by an earlier or interrupted run).
OUTPUTS = (WEIGHTS, PROGRAM, "model.onnx", "model.onnx.data", "step.onnx", "step.onnx.data", TOKENIZER)


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


def save_model(model: Transformer, out: str | Path, space: Space, card: dict[str, Any] | None = None,
               tokenizer: str | None = None) -> Path:
    """Write weights, subnet, tokenizer and model card of ``model`` into directory ``out``; return the card path.
    ``tokenizer``: the text of the model's ``tokenizer.json`` (its vocabulary, :mod:`supernet.tokenizer`); None: the
    byte vocabulary."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale(out, (CARD, SUBNET, *DESCRIPTIONS, *OUTPUTS))  # the card first: never described by an older card
    rows = model.config.vocab_size
    # a model of text has its tokenizer.json (the bytes' where none is given); a task's ids that are no text (a model of
    # fewer than 256 ids: a declared task's labels, grid cells) have none
    text = tokenizer if tokenizer is not None else byte_tokenizer_json() if rows == BYTES else None
    vocab = Vocabulary(text, str(out / TOKENIZER)) if text is not None else None
    if vocab is not None and vocab.size != rows:
        raise UserError(f"{out / TOKENIZER}: a vocabulary of {vocab.size:,} ids for a model of {rows:,} embedding rows")
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_save_tensors(out / WEIGHTS, state, metadata={"format": FORMAT})
    subnet = model.subnet
    atomic_write(out / SUBNET, subnet.to_yaml())
    files = {WEIGHTS: sha256_file(out / WEIGHTS)}
    described = {}
    if vocab is not None:
        atomic_write(out / TOKENIZER, vocab.text.encode("utf-8"))
        files[TOKENIZER] = sha256_file(out / TOKENIZER)
        described = {"tokenizer": {"file": TOKENIZER, "kind": vocab.kind, "vocab": vocab.size, "sha256": vocab.sha256,
                                   "metadata": vocab.metadata()}}
    full = {
        "format": FORMAT,
        "version": VERSION,
        "space": space.to_dict(),
        "subnet": subnet.to_dict(),
        "parameters": model.num_params(),
        **described,
        "files": files,
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


def fitting_model(weights: Path, build: Callable[[], torch.nn.Module], card: Path) -> torch.nn.Module:
    """``build()``, once the weights file is known to hold every tensor the model will have, of its shape.

    ``build`` runs on the meta device first (no memory is allocated), and its tensors' shapes are compared with those
    the safetensors header lists: a card whose space and subnet claim more than its weights hold (a 7 KB card of
    vocabulary 2^20 and width 65536 asks for 275 GB) is refused in one line before the model is built for real."""
    from safetensors import SafetensorError, safe_open

    with torch.device("meta"):
        wanted = {k: tuple(v.shape) for k, v in build().state_dict().items()}
    try:
        with safe_open(str(weights), "pt") as f:
            held = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise UserError(f"{weights}: not a readable safetensors file ({first_line(e, 160)})") from None
    wrong = [k for k in wanted if held.get(k) != wanted[k]]
    if wrong:
        k = wrong[0]
        size = sum(math.prod(shape) for shape in wanted.values())
        raise UserError(f"{card}: describes a model of {size:,} parameters that {weights.name} does not hold ({k}: the "
                        f"card's {wanted[k]}, the file's {held.get(k, 'none')}); the card and its weights do not match")
    return build()


def load_vocabulary(model_dir: str | Path, card: dict[str, Any] | None = None, onnx: str | None = "model.onnx") -> Vocabulary:
    """The vocabulary a model folder's model reads: its ``tokenizer.json``, checked against the card's checksum, the
    model's embedding (no more ids than rows) and, where the folder holds ``onnx``, that graph's ``nas.tokenizer``
    metadata; a folder written before tokenizers travelled with models reads bytes.  One line for each refusal."""
    model_dir = Path(model_dir)
    card = card or read_card(model_dir)
    space = card_space(model_dir, card)
    subnet = Subnet.from_dict(card["subnet"], where=f"{CARD}[subnet]") if space.subnet_type is Subnet else None
    rows = space.vocab_of(subnet) if subnet is not None and hasattr(space, "vocab_of") else space.vocab_size
    if TOKENIZER not in (card.get("files") or {}):
        if getattr(space, "tokenizer", None) is not None and space.tokenizer.bpe:
            raise UserError(f"{model_dir / CARD}: lists no {TOKENIZER}, which a model of a subword vocabulary needs")
        return Vocabulary(byte_tokenizer_json(), "(bytes)")  # a byte model of an earlier version
    vocab = read_vocabulary(verify_file(model_dir, TOKENIZER, card), embedding=rows)
    if vocab.size != rows:
        raise UserError(f"{model_dir / TOKENIZER}: a vocabulary of {vocab.size:,} ids, but the model's embedding has "
                        f"{rows:,} rows")
    if onnx is not None and (model_dir / onnx).is_file():
        check_onnx_tokenizer(model_dir / onnx, vocab)
    return vocab


def check_onnx_tokenizer(graph: Path, vocab: Vocabulary) -> None:
    """Refuse a graph whose ``nas.tokenizer`` metadata names another vocabulary than ``vocab`` (the folder's)."""
    import onnx

    try:
        meta = {p.key: p.value for p in onnx.load(str(graph), load_external_data=False).metadata_props}
    except Exception as e:  # noqa: BLE001 - a damaged graph: onnx's own refusal
        raise UserError(f"{graph}: not a readable ONNX model ({type(e).__name__})") from None
    said = meta.get("nas.tokenizer")
    if said is not None and said != vocab.metadata():
        raise UserError(f"{graph}: its metadata nas.tokenizer is {said[:80]!r}, but {vocab.where} is {vocab.metadata()[:80]!r} "
                        "(the folder's tokenizer is not the one the model was exported with)")


def load_model(model_dir: str | Path, device: str | torch.device = "cpu") -> Transformer:
    """Load an exported model (eval mode): ``model = supernet.load_model("out/")``."""
    _, weights, space, subnet = open_export(model_dir)
    config = TransformerConfig.from_subnet(space, subnet)
    model = fitting_model(weights, lambda: Transformer(config), Path(model_dir) / CARD)
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
        with torch.no_grad():  # inference only (a memory's gradient cut would guard the length on the memory)
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


# The entries of a program ``torch.export.save`` writes (under one root folder), and nothing else: markers, the graph
# (JSON), weights and constants as raw bytes described by their configs (JSON), and the sample inputs (``torch.save``
# of tensors, read with ``weights_only=True``).  Everything else is refused before ``torch.export.load`` sees the file:
# the legacy pickled weights and constants (``data/weights/model.pt``, ``data/constants/model.pt``:
# ``torch.load(weights_only=False)`` of them runs their pickle), script, custom and opaque objects (``custom_obj_*``,
# ``opaque_obj_*``: unpickled whatever their config's ``use_pickle`` says), compiled AOTInductor libraries
# (``data/aotinductor/``: loaded as code), the older zip format (``serialized_*.pt``), extra files and unknown names.
PROGRAM_ENTRIES = re.compile(
    r"archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id|models/model\.json"
    r"|data/sample_inputs/model\.pt|data/weights/(model_weights_config\.json|weight_\d+)"
    r"|data/constants/(model_constants_config\.json|tensor_\d+)"
)
PAYLOADS = {"data/weights/model_weights_config.json": re.compile(r"weight_\d+"),
            "data/constants/model_constants_config.json": re.compile(r"tensor_\d+")}
MAX_CONFIG_BYTES = 16 << 20  # a payload config (JSON): about 300 bytes a tensor


def check_program(path: str | Path) -> None:
    """Refuse a ``.pt2`` archive that ``torch.export.load`` would run or unpickle anything from, entry by entry.

    Every entry must be one a safe program has (:data:`PROGRAM_ENTRIES`, under the archive's one root folder), stored
    uncompressed as ``torch.export.save`` stores it, and named once; each payload config must describe raw tensors
    only (``use_pickle: false``, a ``weight_N`` / ``tensor_N`` file); the sample inputs must load under
    ``torch.load(weights_only=True)``.  One line names the archive and the first entry that is not so.
    """
    import io
    import zipfile

    path = Path(path)

    def refuse(why: str) -> UserError:
        return UserError(f"{path}: {why}; loading it could run code, refused")

    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            if not infos:
                raise UserError(f"{path}: not a torch.export archive (an empty zip)")
            root = infos[0].filename.split("/", 1)[0]
            seen: set[str] = set()
            for info in infos:
                name = info.filename
                inner = name[len(root) + 1:] if name.startswith(root + "/") else None
                if inner is None or not PROGRAM_ENTRIES.fullmatch(inner):
                    raise refuse(f"holds an entry a torch.export program does not have ({shown(name)})")
                if name in seen:
                    raise refuse(f"holds the entry {shown(name)} twice")
                if info.compress_type != zipfile.ZIP_STORED:
                    raise refuse(f"holds a compressed entry ({shown(name)}; torch.export.save stores them as they are)")
                seen.add(name)
            for config, files in PAYLOADS.items():
                if f"{root}/{config}" not in seen:
                    raise UserError(f"{path}: not a torch.export archive (no {config})")
                info = z.getinfo(f"{root}/{config}")
                if info.file_size > MAX_CONFIG_BYTES:
                    raise refuse(f"{config} of {info.file_size:,} bytes")
                entries = json.loads(z.read(info)).get("config", {})
                if not isinstance(entries, dict):
                    raise refuse(f"{config} holds no mapping of tensors")
                for key, value in entries.items():
                    file = value.get("path_name") if isinstance(value, dict) else None
                    if not isinstance(file, str) or not files.fullmatch(file):
                        raise refuse(f"{config}: {shown(key)} is stored as {shown(file)}, not as raw tensor bytes")
                    if value.get("use_pickle", True) is not False:
                        raise refuse(f"holds pickled entries ({shown(key)} in {config})")
            for name in (n for n in seen if "/data/sample_inputs/" in n):
                torch.load(io.BytesIO(z.read(name)), weights_only=True)
    except (zipfile.BadZipFile, json.JSONDecodeError, KeyError, AttributeError) as e:
        raise UserError(f"{path}: not a readable torch.export archive ({type(e).__name__}: {first_line(e, 160)})") from None
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - torch.load refusing a pickle, a truncated member, ...
        raise UserError(
            f"{path}: an entry needs more than weights to load ({type(e).__name__}: {first_line(e, 160)}); refused"
        ) from None


def load_program(model_dir: str | Path) -> torch.nn.Module:
    """The exported program of ``model_dir`` as a plain ``nn.Module`` (checksum and pickle checks first)."""
    model_dir = Path(model_dir)
    path = verify_file(model_dir, PROGRAM)
    check_program(path)
    try:
        return torch.export.load(str(path)).module()
    except Exception as e:  # noqa: BLE001 - a version mismatch or a corrupt graph
        raise UserError(f"{path}: torch.export.load failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None

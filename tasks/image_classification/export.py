"""An exported image classifier: weights, card and ONNX graph of a static :class:`~.model.ViT`, and reading it back.

The layout of :mod:`supernet.artifact` (``model.safetensors``, ``subnet.yaml``, ``model_card.json`` with the format
marker, the full space, the subnet, the parameter count and the checksums, written last); the card says
``task: image-classification``, the data, the validation accuracy (and the test accuracy when the data has a test
split), the class names, the augmentation it was trained with and the input it takes.  ``model.onnx`` takes
``images`` (batch, C, H, W) float32 in [0, 1] and gives ``logits`` (batch, classes); its parity with torch is checked
to :data:`supernet.export.PARITY_TOL` on seeded images before it is kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from search_spaces import UserError

from .model import ViT
from .space import TASK, VisionSubnet

ONNX = "model.onnx"


def save_vision_model(model: ViT, out: Path, card: dict[str, Any]) -> Path:
    from supernet.artifact import CARD, FORMAT, OUTPUTS, SUBNET, VERSION, WEIGHTS, write_json_atomic
    from supernet.files import atomic_save_tensors, atomic_write, remove_stale, sha256_file

    out.mkdir(parents=True, exist_ok=True)
    remove_stale(out, (CARD, SUBNET, *OUTPUTS))
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_save_tensors(out / WEIGHTS, state, metadata={"format": FORMAT})
    atomic_write(out / SUBNET, model.subnet.to_yaml())
    write_json_atomic(out / CARD, {"format": FORMAT, "version": VERSION, "task": TASK, "space": model.space.to_dict(),
                                   "subnet": model.subnet.to_dict(), "parameters": model.num_params(),
                                   "files": {WEIGHTS: sha256_file(out / WEIGHTS)}, **card})  # fmt: skip
    return out / CARD


def load_vision_model(model_dir: str | Path) -> tuple[ViT, dict[str, Any]]:
    """(the static model, its card) of an exported image classifier; one line when the folder is not one."""
    from supernet.artifact import CARD, fitting_model, load_weights, open_export

    card, weights, space, subnet = open_export(model_dir, VisionSubnet)
    model = fitting_model(weights, lambda: ViT(space, subnet), Path(model_dir) / CARD)  # (what the card claims: bounded)
    load_weights(model, weights)
    return model.eval(), card


def onnx_parity(model: ViT, path: Path, seed: int = 0) -> float:
    """max |onnxruntime - torch| of the logits on 3 seeded images."""
    import onnxruntime as ort

    from .timing import images

    x = images(model.space, 3, seed=seed + 1)
    with torch.no_grad():
        want = model(torch.from_numpy(x))[:, 0].numpy()
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"images": x})[0]
    return float(np.abs(got - want).max())


def onnx_metadata(model: ViT) -> dict[str, str]:
    """The ``nas.*`` entries of the graph's metadata: the task, the input it takes, the classes, the subnet (canonical
    JSON), the space hash and this package's version (as :func:`supernet.export.onnx_metadata` for the LM tasks)."""
    from search_spaces.version import __version__

    space = model.space
    return {"nas.task": TASK, "nas.input": f"images (batch, {space.channels}, {space.image_size}, {space.image_size}) "
            "float32 in [0, 1]", "nas.classes": str(space.classes), "nas.subnet": model.subnet.to_json(),
            "nas.space_hash": space.hash, "nas.version": __version__}  # fmt: skip


def write_onnx(model: ViT, out: Path, target_ort: str | None, seed: int = 0) -> dict[str, Any]:
    from supernet.export import PARITY_TOL, choose_opset
    from supernet.artifact import update_card
    from supernet.onnx_export import add_metadata

    from .timing import export_vit_onnx

    opset, notes = choose_opset(target_ort)
    export_vit_onnx(model, out / ONNX, opset)
    add_metadata(out / ONNX, onnx_metadata(model))  # before the card's sha256 of the file
    parity = onnx_parity(model, out / ONNX, seed)
    if not parity <= PARITY_TOL:
        (out / ONNX).unlink(missing_ok=True)
        raise UserError(f"{out / ONNX}: ONNX Runtime differs from torch by {parity:.3g} (max abs, fp32), over the "
                        f"{PARITY_TOL:g} limit; the graph was not kept")
    record = {"file": ONNX, "opset": opset, "parity_max_abs": parity, "inputs": {"images": "(batch, C, H, W) float32 in [0, 1]"},
              "outputs": {"logits": "(batch, classes)"}, "notes": notes}
    update_card(out, files=[ONNX], onnx=record)
    return record


def export_vision(supernet, payload: dict, subnet: VisionSubnet, settings, predicted: dict | None):
    """The task's export (:meth:`tasks.base.Task.export`): safetensors + card (accuracy on the validation split and on
    the test split), the ONNX graph (parity-checked)."""
    from latency.measure import measure_model, predicted_line
    from supernet.export import Exported

    from search_spaces import tasks

    from .train import accuracy, held_out

    task = tasks.get(TASK)
    s = settings
    if s.precision != "fp32":
        raise UserError(f"--precision {s.precision}: an image classifier exports in fp32 (time int8 with nas measure-latency)")
    static = supernet.extract(subnet).eval()
    data = task.data_for(payload, s.scoring.path)
    val = accuracy(static, held_out(data.val))
    test = accuracy(static, held_out(data.test)) if data.test is not None else None
    space = supernet.space
    card = {
        "data": {"source": data.source, "classes": list(data.classes), "hash": data.hash[:16],
                 **task.data_record(payload["meta"], str(s.scoring.path))},
        "input": {"size": space.image_size, "channels": space.channels, "range": "[0, 1] (the model normalises)"},
        "augmentation": f"random crop of the image padded by {space.pad} px" + (", horizontal flip" if space.flip else ""),
        "validation": {"accuracy": val, "images": len(data.val), "metric": "top-1 accuracy, inherited weights"},
        "test": {"accuracy": test, "images": len(data.test)} if test is not None else None,
        "supernet": {"checkpoint": str(Path(s.scoring.path).resolve()), "step": payload["meta"].get("step")},
        "latency": predicted,
    }
    out = Path(s.out)
    (out / ONNX).unlink(missing_ok=True)
    save_vision_model(static, out, card)
    lines = [f"wrote {out}: {static.num_params():,} parameters, subnet {subnet}",
             f"validation accuracy {val:.4f} ({len(data.val)} images)"
             + (f", test accuracy {test:.4f} ({len(data.test)} images)" if test is not None else "")]
    if "onnx" in s.formats:
        onnx = write_onnx(static, out, s.target_ort, s.seed)
        lines.append(f"  onnx              {out / ONNX}  (opset {onnx['opset']}); parity max |onnxruntime - torch| = "
                     f"{onnx['parity_max_abs']:.2e}")
    if "torch" in s.formats:
        lines.append("not written for an image classifier yet: model.pt2 (the safetensors, the card and model.onnx are)")
    if predicted:
        lines.append(predicted_line(predicted))

    def time(device, workload, protocol, **kw) -> dict:
        return measure_model(device, static, workload, protocol, **kw)

    return Exported(out, lines, [], time)


# --------------------------------------------------------------------------- classifying PNG files


def classify_files(model: ViT, card: dict[str, Any], files: list[Path], top: int = 1) -> list[tuple[Path, list]]:
    """Each PNG's ``top`` classes and probabilities; an image of another size or mode than the model's is a ValueError."""
    from .data import read_png, to_float

    space = model.space
    names = (card.get("data") or {}).get("classes") or [str(k) for k in range(space.classes)]
    if not isinstance(names, list) or len(names) != space.classes:  # (a model trained before the classes were checked)
        raise ValueError(f"the model card names {len(names) if isinstance(names, list) else 'no'} classes, the model has "
                         f"{space.classes} outputs: it was trained into a wider head than its data's classes; train it "
                         "again with the space's classes set to the data's")
    out = []
    for f in files:
        a = read_png(f)
        if a.shape[0] != space.channels:
            have, want = ("grayscale" if c == 1 else "RGB" for c in (a.shape[0], space.channels))
            raise ValueError(f"{f}: a {have} image, the model takes {want} images")
        if a.shape[1:] != (space.image_size, space.image_size):
            raise ValueError(f"{f}: {a.shape[2]} x {a.shape[1]} pixels, the model takes {space.image_size} x {space.image_size}")
        with torch.no_grad():
            p = torch.softmax(model(torch.from_numpy(to_float(a[None])))[0, 0], -1)
        best = torch.topk(p, min(top, len(p)))
        out.append((f, [(names[int(i)], float(v)) for v, i in zip(best.values, best.indices)]))
    return out

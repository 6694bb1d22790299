"""``nas train-subnet`` of an image-classification subnet: one static ViT trained on its own, written as an export.

:func:`train_vision_subnet` trains the subnet with the one training loop (:class:`supernet.train.PlainObjective`:
one pass a step, the augmented batches of :class:`.train.ImageLearner`), from scratch (weights drawn from the seed) or
from a supernet's weights (``init="supernet:PATH"``), then writes ``out`` as ``nas export`` does (weights, card with
the validation and test accuracy, ``model.onnx`` parity-checked); ``out/train/`` holds the checkpoints and the log.
``resume`` continues ``out/train/latest.pt`` exactly (the stored settings hold).  Not yet: ``--distill-from``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from search_spaces import UserError


@dataclass(frozen=True)
class VisionSubnetResult:
    out: Path
    steps: int
    images: int
    val_accuracy: float
    test_accuracy: float | None
    seconds: float
    stopped: str
    parameters: int

    def summary(self) -> list[str]:
        test = f", test accuracy {self.test_accuracy:.4f}" if self.test_accuracy is not None else ""
        return [f"trained {self.steps:,} steps ({self.images:,} images) in {self.seconds:.0f} s; validation accuracy "
                f"{self.val_accuracy:.4f}{test}",
                f"wrote {self.out} ({self.parameters:,} parameters; nas classify-image {self.out} IMAGE.png)"]


def train_vision_subnet(space, subnet, out: Path, config, data_settings: dict[str, Any], *, init: str = "scratch",
                        device: str = "cpu", formats: tuple[str, ...] = ("onnx",), progress=None,
                        stored: dict | None = None) -> VisionSubnetResult:
    """Train ``subnet`` of ``space`` (``config``: :class:`supernet.train.TrainConfig`; ``data_settings``: data, data_seed,
    val_fraction) and write the model folder ``out`` (see the module doc); ``stored``: the run's checkpoint to resume."""
    import torch

    from search_spaces import tasks
    from supernet.train import PlainObjective, StaticCheckpointer, train

    from .export import save_vision_model, write_onnx
    from .space import TASK
    from .train import ImageLearner, accuracy, held_out

    task = tasks.get(TASK)

    out = Path(out)
    space.check(subnet)
    run = out / "train"
    if (run / "latest.pt").exists() and stored is None:
        raise UserError(f"--out {out}: already holds a training run ({run / 'latest.pt'}); add --resume to continue it, or "
                        "choose another --out")
    data = task.prepare_data(data_settings, run)
    learner = ImageLearner(space.pad, space.flip, (space.channels, space.image_size, space.image_size), space.classes)
    if init == "scratch" or stored is not None:  # (a resumed run's weights are the checkpoint's)
        model = task.scratch(space, subnet, generator=torch.Generator().manual_seed(config.seed))
    elif init.startswith("supernet:"):
        from supernet.checkpoint import load_supernet

        supernet, _ = load_supernet(init.split(":", 1)[1])
        if supernet.space.arch_hash != space.arch_hash:
            raise UserError(f"--init {init}: trained on space {supernet.space.name!r}, not on {space.name!r}")
        model = supernet.extract(subnet).train()
    else:
        raise UserError(f"--init {init}: an image-classification subnet starts from scratch or supernet:PATH")
    model = model.to(device)
    if stored is not None and stored["meta"].get("corpus_hash") != data.hash:
        raise UserError(f"{run / 'latest.pt'}: trained on data {stored['meta'].get('corpus_hash', '?')[:16]}, the data now "
                        f"hashes to {data.hash[:16]}")
    settings = {"init": init, "tokens": None, "device": device, "corpus_dir": None, "formats": list(formats), **data_settings}
    meta = {**data_settings, "corpus": data.source, "corpus_hash": data.hash, "subnet": subnet.to_dict(), "init": init,
            "kind": "subnet", "settings": settings}
    t0 = time.perf_counter()
    result = train(model, PlainObjective(task=learner), data.train, data.val, config, out=run,
                   checkpointer=StaticCheckpointer(space, subnet), meta=meta, progress=progress,
                   resume=stored if stored is not None else False)
    seconds = time.perf_counter() - t0
    model = model.cpu().eval()
    val = accuracy(model, held_out(data.val))
    test = accuracy(model, held_out(data.test)) if data.test is not None else None
    card = {"data": {"source": data.source, "classes": list(data.classes), "hash": data.hash[:16], **data_settings},
            "input": {"size": space.image_size, "channels": space.channels, "range": "[0, 1] (the model normalises)"},
            "augmentation": f"random crop of the image padded by {space.pad} px" + (", horizontal flip" if space.flip else ""),
            "validation": {"accuracy": val, "images": len(data.val), "metric": "top-1 accuracy"},
            "test": {"accuracy": test, "images": len(data.test)} if test is not None else None,
            "training": {"init": init, "steps": result.step, "images": result.step * config.batch_size, "seconds": seconds,
                         "stopped": result.stopped, "config": config.to_dict()}}  # fmt: skip
    save_vision_model(model, out, card)
    if "onnx" in formats:
        write_onnx(model, out, None)
    return VisionSubnetResult(out, result.step, result.step * config.batch_size, val, test, seconds, result.stopped,
                              model.num_params())


def train_subnet(settings, progress=None) -> VisionSubnetResult:
    """The task's ``nas train-subnet`` (``settings``: :class:`supernet.runs.SubnetTraining`)."""
    s = settings
    if s.distill_from:
        raise UserError("--distill-from: not for an image-classification subnet yet")
    if s.tokens is not None:
        raise UserError("--tokens: an image-classification subnet trains for --max-steps or --max-time")
    data = {"data": s.data, "data_seed": s.data_seed, "val_fraction": s.val_fraction if s.val_fraction != 0.05 else 1 / 12}
    device = "cpu" if s.device in (None, "auto") else s.device
    if s.resume:
        data = {k: s.stored["meta"]["settings"][k] for k in ("data", "data_seed", "val_fraction")}
    return train_vision_subnet(s.space, s.subnet, Path(s.out), s.config, data, init=s.init, device=device,
                               formats=tuple(f for f in s.formats if f == "onnx"), progress=progress,
                               stored=s.stored if s.resume else None)

"""``nas train-subnet`` of an image-classification subnet: one static ViT trained on its own, written as an export.

:func:`train_subnet` trains the subnet with the one training loop (the augmented batches of
:class:`.train.ImageLearner`) in the run-folder protocol of :mod:`supernet.runs`: from scratch (weights drawn from the
seed) or from a supernet's weights (``init="supernet:PATH"``: the subnet's slice, extracted), optionally distilled
from a supernet's largest subnet (``distill_from="supernet:PATH"``, weight ``distill``:
:class:`supernet.train.DistillObjective`), then writes ``out`` as ``nas export`` does (weights, card with the
validation and test accuracy, ``model.onnx`` parity-checked); ``out/train/`` holds the checkpoints and the log.
``resume`` continues ``out/train/latest.pt`` exactly (the stored settings must hold but for the bounds and outputs); a
rerun of a finished run returns its result without training. :func:`train_vision_subnet` is the same with plain
arguments (the benchmarks)."""

from __future__ import annotations

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


def _settings(s) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the data settings, the run's record: what its checkpoints and card keep and a resumed run must agree with)."""
    from supernet.runs import parse_source, source_text

    data = {"data": s.data, "data_seed": s.data_seed, "val_fraction": s.val_fraction if s.val_fraction != 0.05 else 1 / 12}
    if s.resume and s.stored is not None:
        data = {k: s.stored["meta"]["settings"][k] for k in ("data", "data_seed", "val_fraction")}
    kind, path = parse_source(s.init, "--init", ("scratch", "supernet"))
    teacher = parse_source(s.distill_from, "--distill-from", ("supernet",))[1] if s.distill_from else None
    options = {k: v for k, v in (s.options or {}).items() if v is not None}
    record = {"init": source_text(kind, path), "tokens": None, "device": str(s.device), "corpus_dir": None,
              "formats": list(s.formats), **data, **options,
              **({"distill_from": source_text("supernet", teacher), "distill": s.distill} if teacher else {})}
    return data, record


def initial_model(settings):
    """The static ViT a new run of ``settings`` starts from (CPU, train mode): fresh weights drawn from the seed, or the
    subnet's slice of the supernet of ``init="supernet:PATH"``."""
    import torch

    from search_spaces import tasks
    from supernet.runs import parse_source, source_supernet

    s = settings
    kind, path = parse_source(s.init, "--init", ("scratch", "supernet"))
    if kind == "scratch":
        return tasks.of(s.space).scratch(s.space, s.subnet, generator=torch.Generator().manual_seed(s.config.seed)).train()
    supernet, _ = source_supernet(path, s.space, "--init")
    return supernet.extract(s.subnet).train()


def _finished(out: Path, stored: dict, config) -> VisionSubnetResult | None:
    """The result of a run that already reached its bound and wrote its model, else None."""
    from supernet.runs import finished_card

    card = finished_card(out, stored, config)
    if card is None:
        return None
    t = card["training"]
    return VisionSubnetResult(out, t["steps"], t["images"], card["validation"]["accuracy"],
                              (card.get("test") or {}).get("accuracy"), t["seconds"], t["stopped"], card["parameters"])


def train_subnet(settings, progress=None) -> VisionSubnetResult:
    """The task's ``nas train-subnet`` (``settings``: :class:`supernet.runs.SubnetTraining`; see the module doc).  Every
    check runs before anything is written; SIGINT / SIGTERM save ``latest.pt`` and raise
    :class:`supernet.runs.TrainingInterrupted`."""
    import time

    import torch

    from search_spaces import tasks
    from search_spaces.version import __version__
    from supernet.runs import (TrainingInterrupted, check_resumable, check_settings, check_subnet, run_dir, run_state,
                               teacher_model)
    from supernet.task import task_for
    from supernet.train import (Distilled, DistillObjective, PlainObjective, StaticCheckpointer, read_static_checkpoint,
                                train)

    from .export import save_vision_model, write_onnx
    from .train import accuracy, held_out

    s = settings
    if s.tokens is not None:
        raise UserError("--tokens: an image-classification subnet trains for --max-steps or --max-time")
    out, space, config = Path(s.out), s.space, s.config
    subnet = check_subnet(space, s.subnet)
    check_settings(s)
    data_settings, record = _settings(s)
    learner = task_for(space, seed=config.seed, **(s.options or {}))  # a bad task setting: one line, nothing written
    latest, stored = run_state(out, s.resume, s.stored, read_static_checkpoint)
    if stored is not None:
        if stored["subnet_obj"] != subnet or stored["space_obj"].arch_hash != space.arch_hash:
            raise UserError(f"--resume: {latest} trains {stored['subnet_obj']}, not {subnet}")
        check_resumable(record, config, stored["meta"], formats=True)
        finished = _finished(out, stored, config)
        if finished is not None:
            return finished
    teacher = teacher_model(Path(record["distill_from"].split(":", 1)[1]), space) if "distill_from" in record else None
    task = tasks.of(space)
    data = task.prepare_data(data_settings, run_dir(out))
    if stored is not None:
        task.check_data(data, stored["meta"].get("corpus_hash", "?"), str(latest))
    student = initial_model(s) if stored is None else task.scratch(space, subnet)  # (a resumed run's: the checkpoint's)
    val_held = held_out(data.val)
    before = stored["meta"]["val_accuracy_before"] if stored is not None else accuracy(student, val_held)
    device = torch.device("cpu" if s.device in (None, "auto") else s.device)
    student = student.to(device).train()
    if teacher is not None:
        model = Distilled(student, teacher.to(device))
        objective = DistillObjective(model, s.distill, learner)
    else:
        model, objective = student, PlainObjective(task=learner)
    meta = {**data_settings, "corpus": data.source, "corpus_hash": data.hash, "subnet": subnet.to_dict(),
            "init": record["init"], "kind": "subnet", "settings": record, "val_accuracy_before": before, "nas": __version__,
            "run_started": stored["meta"]["run_started"] if stored is not None else round(time.time(), 3)}
    result = train(model, objective, data.train, data.val, config, out=run_dir(out),
                   checkpointer=StaticCheckpointer(space, subnet), meta=meta, progress=progress,
                   resume=stored if stored is not None else False)
    if result.stopped == "interrupted":
        raise TrainingInterrupted(result.step, result.checkpoint)
    student = student.cpu().eval()
    val = accuracy(student, val_held)
    test = accuracy(student, held_out(data.test)) if data.test is not None else None
    card = {"data": {"source": data.source, "classes": list(data.classes), "hash": data.hash[:16], **data_settings},
            "input": {"size": space.image_size, "channels": space.channels, "range": "[0, 1] (the model normalises)"},
            "augmentation": f"random crop of the image padded by {space.pad} px" + (", horizontal flip" if space.flip else ""),
            "validation": {"accuracy": val, "images": len(data.val), "metric": "top-1 accuracy"},
            "test": {"accuracy": test, "images": len(data.test)} if test is not None else None,
            "training": {**record, "teacher": record.get("distill_from"), "steps": result.step,
                         "images": result.step * config.batch_size, "seconds": round(result.elapsed, 1),
                         "stopped": result.stopped, "seed": config.seed, "config": config.to_dict(),
                         "val_accuracy_before": before, "run_started": meta["run_started"],
                         "learner": learner.to_dict()}}  # fmt: skip
    save_vision_model(student, out, card)
    if "onnx" in s.formats:
        write_onnx(student, out, s.target_ort)
    return VisionSubnetResult(out, result.step, result.step * config.batch_size, val, test, round(result.elapsed, 1),
                              result.stopped, student.num_params())


def train_vision_subnet(space, subnet, out: Path, config, data_settings: dict[str, Any], *, init: str = "scratch",
                        distill_from: str | None = None, distill: float = 0.0, options: dict | None = None,
                        device: str = "cpu", formats: tuple[str, ...] = ("onnx",), progress=None,
                        resume: bool = False) -> VisionSubnetResult:
    """:func:`train_subnet` with plain arguments (``config``: :class:`supernet.train.TrainConfig`; ``data_settings``:
    data, data_seed, val_fraction; ``options``: the task's settings, ``label_smoothing``)."""
    from supernet.runs import SubnetTraining

    return train_subnet(SubnetTraining(
        space=space, subnet=subnet, out=Path(out), init=init, config=config, data=data_settings.get("data"),
        data_seed=data_settings.get("data_seed", 0), val_fraction=data_settings.get("val_fraction", 1 / 12),
        distill_from=distill_from, distill=distill, formats=tuple(formats), device=device, options=options or None,
        resume=resume), progress)  # fmt: skip

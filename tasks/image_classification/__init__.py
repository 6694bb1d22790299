"""``image-classification``: a vision Transformer over a square grid of image patches (the efficient-ViT family).

The folder: :mod:`.space` (the space format, the image genes: resolution, patch, stem; the ``image`` workload),
:mod:`.data` (IDX and PNG readers, the validation split, the seeded augmentation), :mod:`.model` (the elastic and the
static ViT, one forward), :mod:`.train` (the learner: augmented batches, the one scored position), :mod:`.timing`
(the latency parts), :mod:`.export` (the exported classifier, ONNX with parity, classifying PNG files) and
:mod:`.command` (``nas classify-image``).  docs/vision.md is the manual.

The model's tokens are the S x S patch grid in row-major order (T = S * S, no class token), pooled by their mean:
a 2D attention type may read the grid back from T.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from search_spaces.tasks import declare

from ..base import Flag, Task
from .space import IMAGE, TASK, ImageWorkload, describe_vision, parse_vision


class ErrorFitness:
    """``fitness(subnets)`` -> each subnet's top-1 error (a fraction) on fixed validation images, inherited weights."""

    def __init__(self, supernet, held, batch_size: int, device: str, where: str):
        self.model, self.held, self.batch_size = supernet.to(device).eval(), held, batch_size
        self.description = {"task": TASK, "metric": ImageTask.metric, "examples": int(len(held.x))}
        self.summary = f"{len(held.x)} images of the {where}"

    def static(self, model) -> float:
        """A trained static model's top-1 error on the same images."""
        from .train import accuracy

        return 1.0 - accuracy(model, self.held, None, self.batch_size)

    def __call__(self, subnets):
        import numpy as np

        from .train import accuracy

        return np.array([1.0 - accuracy(self.model, self.held, s, self.batch_size) for s in subnets], dtype=np.float64)


class ImageTask(Task):
    name = TASK
    doc = "image classification by a vision Transformer over a row-major grid of patches (Fashion-MNIST by default)"
    metric = "top-1 error"
    unit = "error"
    workload_kinds = (IMAGE,)
    commands = ("tasks.image_classification.command",)  # nas classify-image
    token_unit = "images"
    data_keys = ("data", "data_seed", "val_fraction")
    data_defaults = {"data": None, "data_seed": 0, "val_fraction": 1 / 12}  # 5,000 of Fashion-MNIST's 60,000
    default_workload = IMAGE
    learner_options = ("label_smoothing",)
    flags = (Flag("--label-smoothing", "label_smoothing", float, "F", "image-classification spaces: the share of each "
                  "label's mass spread evenly over the classes in the training loss, in [0, 1) (default 0)",
                  ("train-supernet", "train-subnet")),)

    # ------------------------------------------------------------------ space

    def parse_space(self, data: dict, where: str, source: str) -> Any:
        return parse_vision(data, where, source)

    def describe(self, space: Any) -> str:
        return describe_vision(space)

    def workload_from_record(self, data: dict, where: str) -> Any:
        return ImageWorkload.from_record(data, where)

    def refuse(self, command: str, given: dict[str, Any]) -> None:
        from search_spaces import UserError

        for dest in ("seq_len", "val_data", "hurdles"):
            if given.get(dest) not in (None, False):
                raise UserError(f"--{dest.replace('_', '-')}: not for an image-classification space")
        if command == "search" and given.get("precision", "fp32") not in (None, "fp32"):
            raise UserError(f"--precision {given['precision']}: an image-classification search scores in fp32 (time int8 with "
                            "nas measure-latency --precision and fit the predictor on that table)")
        if command == "search" and given.get("fitness", "inherited") != "inherited":
            raise UserError("--fitness: an image-classification supernet is ranked by its inherited top-1 error only (for now)")

    # ------------------------------------------------------------------ model

    def supernet(self, space: Any, generator: Any = None, **options: Any):
        from search_spaces import UserError

        from .model import SuperViT

        if options:
            raise UserError(f"an image-classification supernet takes no {', '.join(options)} (--split families)")
        return SuperViT(space, generator=generator)

    def scratch(self, space: Any, subnet: Any, generator: Any = None):
        from .model import ViT

        return ViT(space, subnet, generator=generator)

    # ------------------------------------------------------------------ training and data

    def learner(self, space: Any, seed: int = 0, label_smoothing: float | None = None):
        from .train import ImageLearner

        return ImageLearner(space.pad, space.flip, (space.channels, space.image_size, space.image_size), space.classes,
                            label_smoothing or 0.0)

    def prepare_data(self, settings: dict, cache_dir: Any, progress: Any = None):
        from dataclasses import replace

        from search_spaces import UserError

        from .data import load_images

        try:
            data = load_images(settings["data"], settings["val_fraction"], settings["data_seed"] or 0)
        except ValueError as e:
            raise UserError(str(e)) from None
        return replace(data, path=Path(cache_dir))

    def data_for(self, payload: dict, where: Any):
        """The data a checkpoint (``payload``) was trained on, rebuilt and checked against its hash."""
        record = self.data_record(payload["meta"], str(where))
        data = self.prepare_data(record, Path(where).parent)
        self.check_data(data, payload["meta"]["corpus_hash"], str(where))
        return data

    def describe_data(self, data: Any, settings: dict) -> str:
        sizes = data.meta["sizes"]
        return (f"images: {data.source}: {sizes['train']:,} training, {sizes['val']:,} validation, {sizes['test']:,} test, "
                f"{' x '.join(map(str, data.shape))}, {len(data.classes)} classes, hash {data.hash[:16]}")

    def describe_batch(self, config: Any) -> str:
        return f"batch {config.batch_size} images"

    def describe_split(self, record: dict) -> str:
        return (f"validation split of {record['data'] or 'Fashion-MNIST'} (seed {record['data_seed']}, fraction "
                f"{record['val_fraction']:.4g})")

    # ------------------------------------------------------------------ search and export

    def _held(self, payload: dict, scoring: Any):
        from .train import held_out

        data = self.data_for(payload, scoring.path)
        return held_out(data.val, scoring.windows * scoring.batch_size), data

    def fitness(self, model: Any, payload: dict, settings: Any) -> tuple[Any, str]:
        held, data = self._held(payload, settings)
        return ErrorFitness(model, held, settings.batch_size, settings.device,
                            self.describe_split(self.data_record(payload["meta"], str(settings.path)))), data.hash[:16]

    def validation(self, model: Any, payload: dict, scoring: Any) -> dict:
        from .train import accuracy

        held, _ = self._held(payload, scoring)
        acc = accuracy(model, held, None, scoring.batch_size)
        return {"bits_per_byte": 1.0 - acc, "metric": self.metric, "accuracy": acc, "examples": len(held.x),
                "bits_per_label": held.bits(model, None, scoring.batch_size, mixed_precision=False),
                "source": "validation images"}

    def export(self, supernet: Any, payload: dict, subnet: Any, settings: Any, predicted: dict | None):
        from .export import export_vision

        return export_vision(supernet, payload, subnet, settings, predicted)

    pipeline_tag = "image-classification"

    def card_facts(self, space: Any, subnet: Any, card: dict):
        from .card import vision_facts

        return vision_facts(self, space, subnet, card)

    def train_subnet(self, settings: Any, progress: Any = None):
        from .workflows import train_subnet

        return train_subnet(settings, progress)

    # ------------------------------------------------------------------ latency

    def check_timing(self, space: Any, device: str, precision: str | None = "fp32", for_transfer: bool = False) -> None:
        from .timing import require_device

        require_device(space, device, precision, for_transfer)

    def params(self, space: Any, subnet: Any) -> int:
        from .timing import vision_params

        return vision_params(space, subnet)

    def timing_model(self, space: Any, subnet: Any, *, materialize: bool = True):
        from .timing import vision_timing_model

        return vision_timing_model(space, subnet, materialize=materialize)

    def timing_reference(self, space: Any):
        return self.timing_model(space, space.smallest())

    def table_features(self, space: Any, subnet: Any, workload: Any) -> dict[str, float]:
        from .timing import vision_table_features

        return vision_table_features(space, subnet, workload)

    def predictor_features(self, kind: str, space: Any, workload: Any, subnets: Any) -> tuple:
        from .timing import vision_matrix

        return vision_matrix(kind, space, workload, subnets)

    def bundle_models(self, space: Any, seed: int) -> tuple:
        return (lambda s: self.timing_model(space, s)), self.timing_reference(space)

    def bundle_graphs(self, model: Any) -> tuple[dict, dict]:
        from .timing import bundle_graphs

        return bundle_graphs(model)

    def torch_call(self, model: Any, workload: Any, device: str = "cpu", runtime: str = "eager"):
        from .timing import image_call

        return image_call(model, workload, device, runtime)

    def ort_runner(self, model: Any, workload: Any, threads: int | None, provider: str, clock: str, precision: str):
        from .timing import vision_ort_runner

        return vision_ort_runner(model, workload, threads, provider, clock, precision)


TASK_OBJECT = declare(ImageTask())

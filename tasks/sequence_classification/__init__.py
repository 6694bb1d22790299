"""``sequence-classification``: a bidirectional encoder reads a sequence and names its class (Long Range Arena).

Data: TSV files of ``label<TAB>space-separated tokens`` (:mod:`.data`): a folder that ``nas data`` writes from a
generator (:mod:`.listops`, :mod:`.pathfinder`, :mod:`.fmnist`: LRA's ListOps, Pathfinder-32, and Fashion-MNIST
pixels in place of its CIFAR-10) or a user's own TSV with ``--classes``.  Model: the one stack of blocks, with a
[CLS] token first; the classifier is the output at [CLS] (:mod:`.learner`).  Metric: bits per label (the
search's fitness and the supernet's evaluations), accuracy on the cards.  docs/lra.md is the manual.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from search_spaces.tasks import declare

from ..base import Flag, Task
from ..stack import StackTask

NAME = "sequence-classification"
VOCAB_KEYS = ("classes", "symbols")


def _user(e: ValueError):
    from search_spaces import UserError

    return UserError(str(e))


class SequenceClassificationTask(StackTask):
    name = NAME
    doc = "a bidirectional encoder names a sequence's class at its [CLS] token (Long Range Arena: ListOps, Pathfinder, ...)"
    form = "bidirectional"
    pipeline_tag = "text-classification"
    metric = "bits/label"
    unit = "bits"
    token_unit = "tokens"
    data_keys = ("data", "data_seed", "val_fraction")
    data_defaults = {"data": None, "data_seed": 0, "val_fraction": 0.1}
    commands = ("tasks.sequence_classification.command",)
    learner_options = ("pretrain_steps",)
    flags = (Flag("--classes", "classes", int, "N", "sequence-classification spaces: the classes of a TSV of your own "
                  "(labels 0..N-1; a folder of `nas data` declares its own)", ("train-supernet", "train-subnet")),
             Flag("--pretrain-steps", "pretrain_steps", int, "N", "sequence-classification spaces: self-pretraining, the "
                  "run's first N steps (of --max-steps) denoise the training inputs (15% of the tokens masked) before "
                  "the classification's; the schedule and the optimizer start again at step N (default 0: none)",
                  ("train-supernet", "train-subnet")))

    # ------------------------------------------------------------------ data

    def data_settings(self, settings: dict, flags: dict, stored: dict | None) -> dict:
        from search_spaces import UserError

        from .data import vocabulary

        given = flags.get("classes")
        if stored is not None:
            if given is not None and given != stored["classes"]:
                raise UserError(f"--classes {given} differs from the run's {stored['classes']}")
            return {**settings, **{k: stored[k] for k in VOCAB_KEYS}}
        if settings.get("data") is None:
            raise UserError("--data: a sequence-classification space needs data: a folder of `nas data listops|pathfinder|"
                            "fmnist-pixels --out DIR`, or a TSV file of 'label<TAB>tokens' rows with --classes N")
        if not 0.0 < settings["val_fraction"] < 1.0:
            raise UserError(f"--val-fraction: {settings['val_fraction']} is not strictly between 0 and 1")
        try:
            classes, symbols, _ = vocabulary(Path(settings["data"]), given)
        except ValueError as e:
            raise _user(e) from None
        return {**settings, "classes": classes, "symbols": symbols}

    def data_record(self, meta: dict, where: str, hint: str = "") -> dict:
        from search_spaces import UserError

        missing = [k for k in (*self.data_keys, *VOCAB_KEYS) if k not in meta]
        if missing:
            raise UserError(f"{where}: the checkpoint does not say which data it was trained on (meta lacks "
                            f"{', '.join(missing)})")
        return {k: meta[k] for k in (*self.data_keys, *VOCAB_KEYS)}

    def prepare_data(self, settings: dict, cache_dir: Any, progress: Any = None):
        from .data import load

        try:
            return load(settings, cache_dir)
        except ValueError as e:
            raise _user(e) from None

    def check_data(self, data: Any, expected_hash: str, where: str) -> None:
        Task.check_data(self, data, expected_hash, where)  # the base class's: the hashes must agree (not a byte corpus's)

    def describe_data(self, data: Any, settings: dict) -> str:
        s = data.meta["sizes"]
        return (f"data {data.meta['corpus']}: {s['train']:,} training, {s['val']:,} validation examples of up to "
                f"{data.meta['length']:,} tokens, hash {data.hash[:16]}")

    def describe_batch(self, config: Any) -> str:
        return f"batch {config.batch_size} examples"

    def describe_split(self, record: dict) -> str:
        return f"validation examples of {record['data']}"

    def learner(self, space: Any, seed: int = 0, pretrain_steps: int | None = None):
        from .learner import SequenceLearner

        return SequenceLearner(space.max_seq_len, space.vocab_size, pretrain_steps or 0)

    # ------------------------------------------------------------------ search and export

    def _held_out(self, space: Any, payload: dict, path: str, n: int):
        record = self.data_record(payload["meta"], path)
        data = self.prepare_data(record, Path(path).resolve().parent)
        return self.learner(space).heldout(data.val, n), data, record

    def fitness(self, model: Any, payload: dict, settings: Any) -> tuple[Any, str]:
        from supernet.scoring import HeldOutFitness

        held, data, _ = self._held_out(model.space, payload, settings.path, settings.windows * settings.batch_size)
        fit = HeldOutFitness(model, held, batch_size=settings.batch_size, device=settings.device,
                             description={"task": self.name, "metric": self.metric})
        return fit, data.hash[:16]

    def validation(self, model: Any, payload: dict, scoring: Any) -> dict:
        from .learner import accuracy

        space = payload["space"]
        held, data, record = self._held_out(space, payload, scoring.path, scoring.windows * scoring.batch_size)
        return {"bits_per_byte": held.bits(model, None, scoring.batch_size), "metric": self.metric, "examples": len(held.x),
                "accuracy": accuracy(model, held, record["classes"], None, scoring.batch_size),
                "source": "validation examples", "classes": record["classes"], "symbols": record["symbols"],
                "tokens": "ids 0..C-1 the classes, C [CLS] (first), C+1 padding, C+2+i symbol i"}

    def train_subnet(self, settings: Any, progress: Any = None):
        from .train import run_subnet_training

        return run_subnet_training(settings, progress)


TASK = declare(SequenceClassificationTask())

"""Train one subnet of a sequence-classification space from scratch, and score a model's accuracy.

What ``scripts/bench_lra.py`` runs for its uniform types and for the found subnets retrained: the static model of
the subnet (:class:`supernet.Transformer`), the one training loop (:func:`supernet.train.train`) with one plain
pass a step (:class:`supernet.train.PlainObjective`) on the task's batches (:class:`.learner.SequenceLearner`),
the same steps, batch and learning rate for every subnet (a :class:`Schedule`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .data import Sequences
from .learner import SequenceLearner, accuracy, correct


@dataclass(frozen=True)
class Schedule:
    """The training protocol every subnet gets: steps, batch, peak learning rate, warmup, seed."""

    steps: int = 200
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 20
    seed: int = 0
    eval_batches: int = 4
    device: str = "cpu"  # where it trains ("cuda" on a GPU)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def train_subnet(space: Any, subnet: Any, train: Sequences, val: Sequences, schedule: Schedule,
                 progress: Callable[[Any], None] | None = None):
    """The static model of ``subnet`` trained ``schedule.steps`` steps from a seeded initialisation on ``schedule.device``;
    (the model, on the CPU, and the loop's result)."""
    from supernet import Transformer, TransformerConfig
    from supernet.train import PlainObjective, TrainConfig
    from supernet.train import train as run

    s = schedule
    config = TransformerConfig.from_subnet(space, space.check(subnet))
    model = Transformer(config, generator=torch.Generator().manual_seed(s.seed))
    learner = SequenceLearner(space.max_seq_len, space.vocab_size)
    config = TrainConfig(batch_size=s.batch_size, seq_len=min(space.max_seq_len, train.inputs.shape[1]), lr=s.lr,
                         min_lr=s.lr / 10, warmup_steps=s.warmup, max_steps=s.steps, eval_interval=s.steps,
                         eval_batches=s.eval_batches, ckpt_interval=s.steps, log_interval=max(1, s.steps // 10), seed=s.seed)
    result = run(model.to(s.device).train(), PlainObjective(learner), train, val, config, progress=progress)
    return model.cpu().eval(), result


def score_correct(model: Any, examples: Sequences, space: Any, batch_size: int = 8) -> list[bool]:
    """Whether ``model`` gets each example of ``examples`` right, in order (for paired comparisons)."""
    held = SequenceLearner(space.max_seq_len, space.vocab_size).heldout(examples, len(examples))
    return correct(model, held, examples.classes, None, batch_size).tolist()


def run_subnet_training(s: Any, progress: Callable[[Any], None] | None = None):
    """``nas train-subnet`` for a sequence-classification space (``s``: :class:`supernet.runs.SubnetTraining`): the
    subnet from scratch, or from a supernet's or a model's weights (``--init``), trained by the one loop with one plain
    pass a step, resumable (``out/train/latest.pt``), written as a model folder whose card holds the validation bits
    per label, the accuracy and the vocabulary.  No distillation (yet)."""
    import time

    from search_spaces import UserError, tasks
    from search_spaces.version import __version__
    from supernet.runs import (SubnetTrainingResult, TrainingInterrupted, check_subnet, effective_config, parse_source,
                               run_dir, run_state, source_text)
    from supernet.runs import record as run_record

    from ..stack.export import write_model
    from ..stack.train import initial_model
    from supernet.train import PlainObjective, StaticCheckpointer, read_static_checkpoint, use_threads
    from supernet.train import train as run

    if s.distill_from:
        raise UserError("--distill-from: not for a sequence-classification space (yet)")
    if s.tokens is not None:
        raise UserError("--tokens: a sequence-classification run counts steps (--max-steps), not tokens")
    space, subnet, out = s.space, check_subnet(s.space, s.subnet), Path(s.out)
    config = effective_config(s)
    kind, path = parse_source(s.init, "--init", ("scratch", "supernet", "model"))
    record = run_record(s, source_text(kind, path), None)
    latest, stored = run_state(out, s.resume, s.stored, read_static_checkpoint)
    task = tasks.of(space)
    data_settings = (stored["meta"]["data_settings"] if stored is not None else
                     task.data_settings({"data": record["data"], "data_seed": s.data_seed, "val_fraction": s.val_fraction},
                                        s.options or {}, None))
    data = task.prepare_data(data_settings, run_dir(out))
    if stored is not None:
        task.check_data(data, stored["meta"]["corpus_hash"], str(latest))
    learner = SequenceLearner(space.max_seq_len, space.vocab_size)
    held = learner.heldout(data.val, len(data.val))

    def score(model) -> dict[str, Any]:
        return {"bits_per_byte": held.bits(model.eval(), None, config.batch_size), "metric": "bits/label",
                "accuracy": accuracy(model, held, data_settings["classes"], None, config.batch_size),
                "examples": len(held.x), "source": "validation examples", "classes": data_settings["classes"],
                "symbols": data_settings["symbols"]}

    use_threads(config)
    model = initial_model(s)
    before = stored["meta"]["before"] if stored is not None else score(model)
    model.train()
    meta = {"settings": record, "data_settings": data_settings, "corpus_hash": data.hash, "before": before,
            "space_hash": space.hash, "arch_hash": space.arch_hash, "nas": __version__,
            "run_started": stored["meta"]["run_started"] if stored is not None else round(time.time(), 3)}
    result = run(model.to(s.device), PlainObjective(learner), data.train, data.val, config, out=run_dir(out),
                 checkpointer=StaticCheckpointer(space, subnet), meta=meta, resume=stored if stored is not None else False,
                 progress=progress)
    if result.stopped == "interrupted":
        raise TrainingInterrupted(result.step, result.checkpoint)
    model = model.cpu().eval()
    after = score(model)
    card = {"validation": after, "training": {**record, "steps": result.step, "seconds": round(result.elapsed, 1),
                                              "stopped": result.stopped, "seed": config.seed, "train_config": config.to_dict(),
                                              "corpus_hash": data.hash, "corpus": data.meta["corpus"], "before": before}}
    write_model(model, space, out, formats=s.formats, target_ort=s.target_ort, card=card, seed=config.seed)
    return SubnetTrainingResult(out, result.step, result.tokens, after["bits_per_byte"], result.elapsed,
                                before["bits_per_byte"], result.stopped, model.num_params())

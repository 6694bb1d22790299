"""The translation task's parts of the generic workflows: the flags it refuses, its data settings, and training one
encoder-decoder subnet.

``nas train-supernet`` on a ``task: seq2seq`` space is the generic workflow (:mod:`nas.train_supernet`) with the
translation task's data: sentence pairs, the system's gettext catalogs of ``--lang`` (default de) or ``--data
pairs.tsv``; ``--batch-size`` counts pairs.  Not for seq2seq: ``--compile``, ``--seq-len`` and ``--val-fraction``
(a pair is bounded by the space's ``max_seq_len``; the split is 80/10/10 by catalog or line).

``nas train-subnet`` on a seq2seq space runs :func:`train_seq2seq_subnet` (one static model, the same loop
with :class:`supernet.train.PlainObjective` and the translation learner, a token budget in target bytes, exact resume) through
:func:`run_seq2seq_subnet`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search_spaces import UserError

log = logging.getLogger(__name__)


# Refused generic flags, per command: why an encoder-decoder does not take them (yet).
REFUSED = {
    "train-supernet": (("seq_len", "--seq-len"), ("val_fraction", "--val-fraction"), ("compile", "--compile")),
    "train-subnet": (("distill_from", "--distill-from"), ("distill", "--distill"), ("mask_rate", "--mask-rate"),
                     ("seq_len", "--seq-len"), ("val_fraction", "--val-fraction"), ("formats", "--format"),
                     ("target_ort", "--target-ort")),
}
WHY = {
    "train-supernet": "not for a seq2seq space (a pair is bounded by the space's max_seq_len; the split is 80/10/10 by "
                      "catalog or by line; compiling is for the LM run so far)",
    "train-subnet": "not for an encoder-decoder (task seq2seq) subnet (a pair is bounded by the space's max_seq_len; the "
                    "split is by catalog or line; the model is written as safetensors + card; no distillation yet)",
}


def refuse(command: str, given: dict) -> None:
    """The generic flags of ``command`` an encoder-decoder does not take, refused in one line each (first given first);
    ``--data`` and ``--lang`` together."""
    for dest, flag in REFUSED.get(command, ()):
        if given.get(dest) is not None:
            raise UserError(f"{flag}: {WHY[command]}")
    if given.get("split") == "families":
        raise UserError("--split families: not for an encoder-decoder supernet (its projections are not split by family)")
    if given.get("data") is not None and given.get("lang") is not None:
        raise UserError("give --data (your own source<TAB>target file) or --lang (the system's gettext catalogs), not both")


def data_settings(settings: dict, flags: dict, stored: dict | None) -> dict:
    """A run's data settings: ``data`` (a source<TAB>target file) or the gettext catalogs of ``lang`` (default de); a
    resumed run keeps its language."""
    from .data import DEFAULT_LANG

    given = flags.get("lang")
    if stored is not None:
        lang = stored.get("lang")
        if given is not None and given != lang:
            raise UserError(f"--lang {given} differs from the run's {lang} (a resumed run keeps its corpus)")
    else:
        lang = None if settings.get("data") is not None else (given or DEFAULT_LANG)
    return {**settings, "val_fraction": None, "lang": lang}


def corpus_record(meta: dict) -> dict:
    """What a card keeps of a run's corpus: enough to rebuild it and check it is the same."""
    return {k: meta.get(k) for k in ("corpus", "data", "data_seed", "lang", "corpus_hash")}


# --------------------------------------------------------------------------- nas train-subnet on a seq2seq space


@dataclass(frozen=True)
class Seq2SeqSubnetTraining:
    """One encoder-decoder subnet trained on its own (``nas train-subnet`` on a seq2seq space).

    ``init``: ``"scratch"`` (weights drawn from ``config.seed``), ``"supernet:PATH"`` (the subnet's weights extracted
    from a seq2seq supernet of the same space) or ``"model:DIR"`` (a trained model of the same subnet, trained on).
    ``tokens``: a budget in target bytes (EOS included, the loop's unit): the most whole steps of the seeded batches
    that fit it (:func:`tasks.translation.train.steps_for_tokens`), so
    models trained with one budget, seed and batch size see the same pairs in the same order.  Data: the gettext
    catalogs of ``lang`` (default de) or ``data`` (a source<TAB>target file).  ``resume`` continues
    ``out/train/latest.pt`` exactly; only the bounds and outputs may change (:data:`supernet.runs.RESUMABLE`).
    """

    space: Any
    subnet: Any
    out: Path
    init: str = "scratch"
    tokens: int | None = None
    config: Any = None  # TrainConfig (default TrainConfig())
    data: str | None = None
    lang: str | None = None
    data_seed: int = 0
    resume: bool = False
    device: str = "cpu"
    corpus_dir: Path | None = None  # where the pairs are cached (default out/train): runs may share one
    stored: dict | None = field(default=None, compare=False, repr=False)  # a resumed run's loaded checkpoint


@dataclass(frozen=True)
class Seq2SeqSubnetResult:
    out: Path
    steps: int
    tokens: int  # target bytes trained on
    val_ce: float  # validation nats per target byte of the final model (the card's figure)
    val_ce_before: float
    seconds: float
    stopped: str
    parameters: int

    def summary(self) -> list[str]:
        """The lines a command prints about the finished run."""
        from supernet.runs import run_dir

        return [f"trained {self.steps:,} steps ({self.tokens:,} target bytes) in {self.seconds:.0f} s; validation nats/"
                f"target byte {self.val_ce_before:.4f} -> {self.val_ce:.4f}",
                f"wrote {self.out} ({self.parameters:,} parameters; chrF / BLEU: nas translate --model {self.out} --eval test "
                f"--beam 5); checkpoints and log in {run_dir(self.out)}"]


def train_subnet(settings, progress=None) -> Seq2SeqSubnetResult:
    """The translation task's ``nas train-subnet``: the generic settings (:class:`supernet.runs.SubnetTraining`, its
    ``options`` the task's flags: ``lang``) as :class:`Seq2SeqSubnetTraining`, trained by :func:`train_seq2seq_subnet`."""
    s = settings
    device = "cpu" if s.device in (None, "auto") else s.device
    return train_seq2seq_subnet(Seq2SeqSubnetTraining(
        space=s.space, subnet=s.subnet, out=s.out, init=s.init, tokens=s.tokens, config=s.config, data=s.data,
        lang=(s.options or {}).get("lang"), data_seed=s.data_seed, resume=s.resume, device=device, corpus_dir=s.corpus_dir,
        stored=s.stored), progress=progress)  # fmt: skip


def _seq2seq_record(s: Seq2SeqSubnetTraining, init: str) -> dict:
    from supernet.data import absolute_data

    from .data import DEFAULT_LANG

    return {"init": init, "tokens": s.tokens, "data": absolute_data(s.data), "data_seed": s.data_seed,
            "lang": None if s.data is not None else (s.lang or DEFAULT_LANG), "device": str(s.device),
            "corpus_dir": None if s.corpus_dir is None else str(Path(s.corpus_dir).resolve())}  # fmt: skip


def _check_source_model(path: Path, space, subnet) -> None:
    """``--init model:DIR``: DIR must hold a trained model of ``subnet`` of ``space``; one line otherwise."""
    from search_spaces import UserError
    from supernet.artifact import open_export

    from .space import Seq2SeqSubnet

    _, _, their_space, theirs = open_export(path, Seq2SeqSubnet)
    if their_space.arch_hash != space.arch_hash or theirs != subnet:
        raise UserError(f"--init model:{path}: a model of {theirs} (space {their_space.name!r}), not of {subnet} "
                        f"(space {space.name!r})")  # fmt: skip


def _seq2seq_initial(kind: str, path: Path | None, space, subnet, seed: int):
    """(the initial static model, the source's step) of ``--init``."""
    import torch

    from search_spaces import UserError

    from .model import Seq2SeqTransformer
    from .train import load_seq2seq_supernet

    if kind == "scratch":
        return Seq2SeqTransformer(space, subnet, generator=torch.Generator().manual_seed(seed)), None
    if kind == "model":  # a trained encoder-decoder of the same subnet, trained on (the hurdles' next round)
        from .artifact import load_seq2seq_model

        model, card = load_seq2seq_model(path)  # (checked by train_seq2seq_subnet before anything is written)
        return model.train(), (card.get("training") or {}).get("steps")
    supernet, payload = load_seq2seq_supernet(path)
    if supernet.space.arch_hash != space.arch_hash:
        raise UserError(f"--init supernet:{path}: trained on space {supernet.space.name!r} (arch hash "
                        f"{supernet.space.arch_hash}), not on space {space.name!r} (arch hash {space.arch_hash})")  # fmt: skip
    return supernet.extract(subnet), payload["meta"].get("step")


def _seq2seq_finished(out: Path, stored: dict, config) -> Seq2SeqSubnetResult | None:
    """The result of a run that reached its bound and wrote its model (a rerun of a finished run), else None."""
    from supernet.runs import finished_card

    card = finished_card(out, stored, config)
    if card is None:
        return None
    done = card["training"]
    return Seq2SeqSubnetResult(out, done["steps"], done["tokens"], done["ce_after"], done["ce_before"], done["seconds"],
                               done["stopped"], card["parameters"])  # fmt: skip


def train_seq2seq_subnet(settings: Seq2SeqSubnetTraining, progress=None) -> Seq2SeqSubnetResult:
    """Train ``settings.subnet`` as its own model with the training loop (:class:`PlainObjective`: one pass a
    step, no distillation) and write ``settings.out`` as ``nas export`` does for seq2seq (safetensors + model card,
    which ``nas translate --model`` reads); ``out/train/`` holds ``latest.pt``, ``final.pt``, ``log.jsonl`` and the
    corpus cache.  Every check runs before anything is written; SIGINT / SIGTERM save ``latest.pt`` and raise
    :class:`supernet.runs.TrainingInterrupted`; rerunning a finished run with ``resume`` returns its result."""
    import time
    from dataclasses import replace

    import torch

    from search_spaces.version import __version__
    from supernet.runs import TrainingInterrupted, check_resumable, parse_source, run_dir, run_state, source_text
    from search_spaces import UserError
    from supernet.checkpoint import load_checkpoint
    from supernet.train import TrainConfig

    from .artifact import save_seq2seq_model
    from .data import DEFAULT_LANG, check_pairs, prepare_pairs, tokenize_pairs
    from .model import Seq2SeqTransformer
    from supernet.train import PlainObjective, SupernetCheckpointer, train

    from .train import TranslationLearner, eval_batches, heldout_ce, steps_for_tokens

    s = settings
    out, space = Path(s.out), s.space
    subnet = space.check(s.subnet)
    config = s.config if s.config is not None else TrainConfig()
    kind, path = parse_source(s.init, "--init", ("scratch", "supernet", "model"))
    if kind == "model" and not s.resume:
        _check_source_model(path, space, subnet)  # before anything is written
    if str(s.device).startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {s.device}: CUDA is not available on this machine")
    record = _seq2seq_record(s, source_text(kind, path))
    state_dir = run_dir(out)
    latest, stored = run_state(out, s.resume, s.stored, load_checkpoint)  # (loaded once by the command's resume)
    if stored is not None:
        meta = stored["meta"]
        their = stored_subnet(meta, latest)
        if stored["space"].arch_hash != space.arch_hash or their != subnet:
            raise UserError(f"--resume: {latest} trains {their} of space {stored['space'].name!r}, not {subnet} of space "
                            f"{space.name!r}")  # fmt: skip
        check_resumable(record, config, meta, formats=False)

    corpus_dir = state_dir if s.corpus_dir is None else Path(s.corpus_dir)
    corpus = prepare_pairs(record["data"], corpus_dir, seed=s.data_seed, lang=record["lang"] or DEFAULT_LANG)
    if stored is not None:
        check_pairs(corpus, stored["meta"]["corpus_hash"], str(latest))
    if space.tokenizer.bpe:  # the space's joint vocabulary, trained on the training pairs (cached beside them)
        corpus = tokenize_pairs(corpus, space.tokenizer, corpus_dir)
    max_len = space.max_seq_len
    if s.tokens is not None:
        steps, _ = steps_for_tokens(corpus.train, config.batch_size, max_len, config.seed, s.tokens)
        if steps < 1:
            raise UserError(f"--tokens: {s.tokens:,} target bytes are fewer than the first batch of {config.batch_size} "
                            "pairs holds; give more")  # fmt: skip
        config = replace(config, max_steps=steps)
    if stored is not None:
        finished = _seq2seq_finished(out, stored, config)
        if finished is not None:
            log.info("%s: the run already reached step %d and wrote its model", out, finished.steps)
            return finished

    if stored is None:
        student, source_step = _seq2seq_initial(kind, path, space, subnet, config.seed)
    else:
        student, source_step = Seq2SeqTransformer(space, subnet), stored["meta"]["source_step"]
    val = eval_batches(corpus.val, config.batch_size, max_len, config.eval_batches, config.seed)
    before = stored["meta"]["ce_before"] if stored is not None else heldout_ce(student, None, corpus.val, val)
    corpus_rec = {"corpus": corpus.meta["corpus"], "data": record["data"], "data_seed": s.data_seed, "lang": record["lang"],
                  "corpus_hash": corpus.hash}  # fmt: skip
    meta = {"kind": "subnet", "settings": record, "subnet": subnet.to_dict(), "source_step": source_step,
            "ce_before": before, "corpus_hash": corpus.hash, "corpus_record": corpus_rec, "space_hash": space.hash,
            "arch_hash": space.arch_hash, "nas": __version__,
            "run_started": stored["meta"]["run_started"] if stored is not None else round(time.time(), 3)}  # fmt: skip
    if stored is None:
        log.info("training %s (%s parameters) from %s: %.4f nats/target byte before; %s", subnet,
                 f"{student.num_params():,}", record["init"], before,
                 f"{config.max_steps:,} steps of {config.batch_size} pairs" if config.max_steps else f"{config.max_time:g} s")
    model = student.to(torch.device(s.device)).train()
    result = train(model, PlainObjective(TranslationLearner(space.max_seq_len)), corpus.train, corpus.val, config,
                   out=state_dir, checkpointer=SupernetCheckpointer(space), meta=meta,
                   resume=stored if stored is not None else False, progress=progress, report=log.info)  # fmt: skip
    if result.stopped == "interrupted":
        raise TrainingInterrupted(result.step, result.checkpoint)
    model = model.cpu().eval()
    after = heldout_ce(model, None, corpus.val, val)
    card = {
        "corpus": corpus_rec,
        "validation": {"ce_per_target_byte": after, "unit": "nats per target byte (EOS included)",
                       "pairs": int(sum(len(b) for b in val))},  # fmt: skip
        "training": {**record, "token_budget": s.tokens, "steps": result.step, "tokens": result.tokens,
                     "seconds": round(result.elapsed, 1), "stopped": result.stopped, "seed": config.seed,
                     "train_config": config.to_dict(), "corpus_hash": corpus.hash, "source_step": source_step,
                     "ce_before": before, "ce_after": after, "run_started": meta["run_started"],
                     "versions": {"nas": __version__, "torch": str(torch.__version__)}},  # fmt: skip
    }
    save_seq2seq_model(model, out, card, corpus.vocabulary.text if space.tokenizer.bpe else None)
    return Seq2SeqSubnetResult(out, result.step, result.tokens, after, before, result.elapsed, result.stopped,
                               model.num_params())  # fmt: skip


def stored_subnet(meta: dict, where: Path):
    """The subnet a seq2seq train-subnet checkpoint trains (its meta), or one line saying it is not such a run."""
    from search_spaces import UserError

    from .space import Seq2SeqSubnet

    if meta.get("kind") != "subnet" or "settings" not in meta:
        raise UserError(f"{where}: not a train-subnet run of an encoder-decoder (a supernet's checkpoint?); start a new run "
                        "in another --out")  # fmt: skip
    return Seq2SeqSubnet.from_dict(meta["subnet"], where=f"{where}[subnet]")

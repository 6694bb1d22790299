"""``nas train-supernet`` on a ``task: seq2seq`` space: the encoder-decoder branch of the command.

The command (:mod:`nas.commands.train_supernet`) hands a seq2seq space (or a ``--resume`` of a seq2seq run)
here.  Same flags and files as the LM run (``latest.pt``, ``final.pt``, ``log.jsonl``, the corpus cache in
``--out``), with sentence pairs for data: the system's gettext catalogs of ``--lang`` (default de) or
``--data pairs.tsv``; ``--batch-size`` counts pairs.  Not for seq2seq: ``--compile``, ``--seq-len`` and
``--val-fraction`` (a pair is bounded by the space's ``max_seq_len``; the split is 80/10/10 by catalog or line).
Under ``torchrun`` it trains data-parallel (DDP), as the LM run.

``nas train-subnet`` on a seq2seq space runs :func:`train_seq2seq_subnet` (one static model, the same loop
with :class:`supernet.train.PlainObjective` and the translation learner, a token budget in target bytes, exact resume) through
:func:`run_seq2seq_subnet`.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def stored_task(latest: Path) -> str | None:
    """The task of the run in ``latest`` (None when there is no readable checkpoint: the LM path reports that)."""
    from search_spaces import UserError
    from supernet.checkpoint import load_checkpoint

    try:
        return load_checkpoint(latest)["space"].task if latest.exists() else None
    except UserError:
        return None


def run_seq2seq(args: argparse.Namespace, space) -> int:
    import torch

    from nas.commands.train_supernet import _settings
    from search_spaces import UserError
    from supernet.distributed import init_from_env, shutdown
    from supernet.train import TrainConfig

    from .data import DEFAULT_LANG
    from .train import load_seq2seq_supernet

    out = Path(args.out)
    latest = out / "latest.pt"
    for flag, value in (("--seq-len", args.seq_len), ("--val-fraction", args.val_fraction), ("--compile", args.compile)):
        if value is not None:
            raise UserError(f"{flag}: not for a seq2seq space (a pair is bounded by the space's max_seq_len; the split is "
                            "80/10/10 by catalog or by line; compiling is for the LM run so far)")  # fmt: skip
    if args.data is not None and args.lang is not None:
        raise UserError("give --data (your own source<TAB>target file) or --lang (the system's gettext catalogs), not both")
    stored = None
    if args.resume:
        if not latest.exists():
            raise UserError(f"--resume: {out} holds no checkpoint (latest.pt); start a new run without --resume")
        stored = load_seq2seq_supernet(latest, space)[1]
        space = stored["space"]
        lang = stored["meta"].get("lang")
        if args.lang is not None and args.lang != lang:
            raise UserError(f"--lang {args.lang} differs from the run's {lang} (a resumed run keeps its corpus)")
    elif latest.exists():
        raise UserError(f"--out {out}: already holds a run (latest.pt); add --resume to continue it, or choose another --out")
    else:
        lang = None if args.data is not None else (args.lang or DEFAULT_LANG)
    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads: {args.threads} is not a positive integer")
        torch.set_num_threads(args.threads)

    config_dict, objective_dict, data = _settings(args, space, stored["meta"] if stored else None)
    config = TrainConfig.from_dict(config_dict)
    dist, device = init_from_env(args.device)
    try:
        return _train(args, space, stored, config, objective_dict, data, lang, dist, device)
    finally:
        shutdown()


def _train(args, space, stored, config, objective_dict, data, lang, dist, device) -> int:
    import torch

    from nas.commands.train_supernet import _format_time, _step_bar
    from search_spaces import UserError

    from .data import DEFAULT_LANG, check_pairs, prepare_pairs
    from .model import Seq2SeqSuperTransformer
    from supernet.train import SandwichObjective, SupernetCheckpointer, train

    from .train import TranslationLearner

    out = Path(args.out)
    latest = out / "latest.pt"
    if config.batch_size % dist.world:
        raise UserError(f"--batch-size: {config.batch_size} does not split evenly across {dist.world} ranks")
    corpus = None
    for turn in (0, 1):  # rank 0 builds the cache first, the others then read it
        if dist.is_main == (turn == 0):
            corpus = prepare_pairs(data["data"], out, seed=data["data_seed"], lang=lang or DEFAULT_LANG)
        dist.barrier()
    if stored is not None:
        check_pairs(corpus, stored["meta"]["corpus_hash"], str(latest))
    sizes = corpus.meta["sizes"]
    log.info("corpus %s: %s training pairs (%s + %s bytes), %s validation pairs, %s test pairs, hash %s",
             corpus.meta["corpus"], f"{sizes['train']['pairs']:,}", f"{sizes['train']['source_bytes']:,}",
             f"{sizes['train']['target_bytes']:,}", f"{sizes['val']['pairs']:,}", f"{sizes['test']['pairs']:,}",
             corpus.hash[:16])  # fmt: skip
    model = Seq2SeqSuperTransformer(space, generator=torch.Generator().manual_seed(config.seed)).to(device)
    objective = SandwichObjective(space, seed=config.seed, task=TranslationLearner(space.max_seq_len),
                                  **{"n_eval_random": 2, **objective_dict})  # (2 random subnets evaluated, as ever)
    log.info("space %s: %s parameters in the largest subnet; batch %d pairs on %s", space.name,
             f"{model.num_params(space.largest()):,}", config.batch_size, device)  # fmt: skip
    meta = {**data, "val_fraction": None, "lang": lang, "corpus": corpus.meta["corpus"], "corpus_hash": corpus.hash,
            "corpus_sizes": sizes, "corpus_dir": str(corpus.path.relative_to(out))}  # fmt: skip
    state = stored["state"] if stored else {}
    bar, update = _step_bar(config, state.get("step", 0), state.get("elapsed", 0.0)) if dist.is_main else (None, None)
    try:
        result = train(model, objective, corpus.train, corpus.val, config, out=out, checkpointer=SupernetCheckpointer(space),
                       meta=meta, resume=stored if stored is not None else False, progress=update, report=log.info,
                       dist=dist)  # fmt: skip
    finally:
        if bar is not None:
            bar.close()
    if not dist.is_main:
        return 0
    if result.stopped == "interrupted":
        print(f"interrupted at step {result.step}; saved {result.checkpoint}. Continue with: nas train-supernet --out {out} "
              "--resume")  # fmt: skip
        return 130
    print(f"trained {result.step} steps ({result.tokens:,} target bytes) in {_format_time(result.elapsed)}; stopped by "
          f"--{result.stopped.replace('_', '-')}")  # fmt: skip
    if result.evals:
        last = result.evals[-1]
        print(f"validation nats/target byte at step {last['step']}: " + ", ".join(f"{k} {v:.3f}" for k, v in last["ce"].items()))
    print(f"checkpoint: {result.checkpoint} (and {latest}); metrics: {out / 'log.jsonl'}")
    return 0


# --------------------------------------------------------------------------- nas train-subnet on a seq2seq space


@dataclass(frozen=True)
class Seq2SeqSubnetTraining:
    """One encoder-decoder subnet trained on its own (``nas train-subnet`` on a seq2seq space).

    ``init``: ``"scratch"`` (weights drawn from ``config.seed``) or ``"supernet:PATH"`` (the subnet's weights extracted
    from a seq2seq supernet of the same space).  ``tokens``: a budget in target bytes (EOS included, the loop's unit):
    the most whole steps of the seeded batches that fit it (:func:`tasks.translation.train.steps_for_tokens`), so
    models trained with one budget, seed and batch size see the same pairs in the same order.  Data: the gettext
    catalogs of ``lang`` (default de) or ``data`` (a source<TAB>target file).  ``resume`` continues
    ``out/train/latest.pt`` exactly; only the bounds and outputs may change (:data:`nas.train_subnet.RESUMABLE`).
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


def _seq2seq_record(s: Seq2SeqSubnetTraining, init: str) -> dict:
    from supernet.data import absolute_data

    from .data import DEFAULT_LANG

    return {"init": init, "tokens": s.tokens, "data": absolute_data(s.data), "data_seed": s.data_seed,
            "lang": None if s.data is not None else (s.lang or DEFAULT_LANG), "device": str(s.device),
            "corpus_dir": None if s.corpus_dir is None else str(Path(s.corpus_dir).resolve())}  # fmt: skip


def _seq2seq_initial(kind: str, path: Path | None, space, subnet, seed: int):
    """(the initial static model, the source's step) of ``--init``."""
    import torch

    from search_spaces import UserError

    from .model import Seq2SeqTransformer
    from .train import load_seq2seq_supernet

    if kind == "scratch":
        return Seq2SeqTransformer(space, subnet, generator=torch.Generator().manual_seed(seed)), None
    supernet, payload = load_seq2seq_supernet(path)
    if supernet.space.arch_hash != space.arch_hash:
        raise UserError(f"--init supernet:{path}: trained on space {supernet.space.name!r} (arch hash "
                        f"{supernet.space.arch_hash}), not on space {space.name!r} (arch hash {space.arch_hash})")  # fmt: skip
    return supernet.extract(subnet), payload["meta"].get("step")


def _seq2seq_finished(out: Path, stored: dict, config) -> Seq2SeqSubnetResult | None:
    """The result of a run that reached its bound and wrote its model (a rerun of a finished run), else None."""
    from nas.train_subnet import finished_card

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
    :class:`nas.train_subnet.TrainingInterrupted`; rerunning a finished run with ``resume`` returns its result."""
    import time
    from dataclasses import replace

    import torch

    from nas import __version__
    from nas.train_subnet import LATEST, RUN_DIR, TrainingInterrupted, _resume_problems, parse_source, run_dir, source_text
    from search_spaces import UserError
    from supernet.artifact import CARD
    from supernet.checkpoint import load_checkpoint
    from supernet.train import TrainConfig

    from .artifact import save_seq2seq_model
    from .data import DEFAULT_LANG, check_pairs, prepare_pairs
    from .model import Seq2SeqTransformer
    from supernet.train import PlainObjective, SupernetCheckpointer, train

    from .train import TranslationLearner, eval_batches, heldout_ce, steps_for_tokens

    s = settings
    out, space = Path(s.out), s.space
    subnet = space.check(s.subnet)
    config = s.config if s.config is not None else TrainConfig()
    kind, path = parse_source(s.init, "--init", ("scratch", "supernet"))
    if str(s.device).startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {s.device}: CUDA is not available on this machine")
    record = _seq2seq_record(s, source_text(kind, path))
    state_dir = run_dir(out)
    latest = state_dir / LATEST
    stored = None
    if s.resume:
        if not latest.is_file():
            raise UserError(f"--resume: {out} holds no checkpoint ({RUN_DIR}/{LATEST}); start a new run without --resume")
        stored = load_checkpoint(latest)
        meta = stored["meta"]
        their = stored_subnet(meta, latest)
        if stored["space"].arch_hash != space.arch_hash or their != subnet:
            raise UserError(f"--resume: {latest} trains {their} of space {stored['space'].name!r}, not {subnet} of space "
                            f"{space.name!r}")  # fmt: skip
        problems = _resume_problems(record, config, meta)
        if problems:
            raise UserError("--resume: " + "; ".join(problems) + " (a resumed run may change only its bounds and outputs: "
                            "--tokens, --max-steps, --max-time, --eval-interval, --eval-batches, --ckpt-interval, "
                            "--log-interval, --device)")  # fmt: skip
    elif latest.exists():
        raise UserError(f"--out {out}: already holds a training run ({RUN_DIR}/{LATEST}); add --resume to continue it, "
                        "or choose another --out")  # fmt: skip
    elif (out / CARD).exists():
        raise UserError(f"--out {out}: already holds a model ({CARD}) and no training run; choose another --out")

    corpus_dir = state_dir if s.corpus_dir is None else Path(s.corpus_dir)
    corpus = prepare_pairs(record["data"], corpus_dir, seed=s.data_seed, lang=record["lang"] or DEFAULT_LANG)
    if stored is not None:
        check_pairs(corpus, stored["meta"]["corpus_hash"], str(latest))
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
    save_seq2seq_model(model, out, card)
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


def run_seq2seq_subnet(args: argparse.Namespace, space) -> int:
    """``nas train-subnet`` on a seq2seq space (``space`` None with ``--resume``: the run's own)."""
    from nas.commands.train_subnet import NAME, _given_config, _tokens, step_bar, training_config
    from nas.train_subnet import TrainingInterrupted, run_dir
    from search_spaces import UserError
    from supernet.checkpoint import load_checkpoint
    from supernet.train import TrainConfig

    from .space import Seq2SeqSubnet

    refused = {"--distill-from": args.distill_from, "--distill": args.distill, "--mask-rate": args.mask_rate,
               "--seq-len": args.seq_len, "--val-fraction": args.val_fraction, "--format": args.format,
               "--target-ort": args.target_ort}  # fmt: skip
    for flag, value in refused.items():
        if value is not None:
            raise UserError(f"{flag}: not for an encoder-decoder (task seq2seq) subnet (a pair is bounded by the space's "
                            "max_seq_len; the split is by catalog or line; the model is written as safetensors + card; "
                            "no distillation yet)")  # fmt: skip
    if args.data is not None and args.lang is not None:
        raise UserError("give --data (your own source<TAB>target file) or --lang (the system's gettext catalogs), not both")
    out = Path(args.out)
    tokens = _tokens(args)
    if args.resume:
        latest = run_dir(out) / "latest.pt"
        if not latest.is_file():
            raise UserError(f"--resume: {out} holds no checkpoint (train/latest.pt); start a new run without --resume")
        stored = load_checkpoint(latest)
        meta = stored["meta"]
        subnet = stored_subnet(meta, latest)
        if args.subnet:
            subnet = stored["space"].check(Seq2SeqSubnet.load(args.subnet))
        r = meta["settings"]
        given = _given_config(args)  # every config flag given: the library refuses those a resumed run may not change
        config = {**meta["train_config"], **given}
        if tokens is None and "max_steps" not in given:
            tokens = r["tokens"]
        settings = Seq2SeqSubnetTraining(
            space=space or stored["space"], subnet=subnet, out=out, init=args.init or r["init"], tokens=tokens,
            config=TrainConfig.from_dict(config), data=args.data if args.data is not None else r["data"],
            lang=args.lang or r["lang"], data_seed=r["data_seed"] if args.data_seed is None else args.data_seed,
            resume=True, device=args.device or r["device"], corpus_dir=r["corpus_dir"])  # fmt: skip
    else:
        if not args.subnet:
            raise UserError("give the subnet (SUBNET.yaml) and --space SPACE, or --resume to continue the run in --out")
        subnet = space.check(Seq2SeqSubnet.load(args.subnet))
        settings = Seq2SeqSubnetTraining(
            space=space, subnet=subnet, out=out, init=args.init or "scratch", tokens=tokens,
            config=training_config(args, {}, space), data=args.data, lang=args.lang,
            data_seed=args.data_seed or 0, device=args.device if args.device not in (None, "auto") else "cpu")  # fmt: skip
    close, update = step_bar(NAME)
    try:
        result = train_seq2seq_subnet(settings, progress=update)
    except TrainingInterrupted as e:
        print(f"interrupted at step {e.step}; saved {e.checkpoint}. Continue with: nas train-subnet --out {out} --resume")
        return 130
    finally:
        close()
    print(f"trained {result.steps:,} steps ({result.tokens:,} target bytes) in {result.seconds:.0f} s; validation nats/"
          f"target byte {result.val_ce_before:.4f} -> {result.val_ce:.4f}")  # fmt: skip
    print(f"wrote {out} ({result.parameters:,} parameters; chrF / BLEU: nas translate --model {out} --eval test --beam 5); "
          f"checkpoints and log in {run_dir(out)}")  # fmt: skip
    return 0

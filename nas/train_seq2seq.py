"""``nas train-supernet`` on a ``task: seq2seq`` space: the encoder-decoder branch of the command.

The command (:mod:`nas.commands.train_supernet`) hands a seq2seq space (or a ``--resume`` of a seq2seq run)
here.  Same flags and files as the LM run (``latest.pt``, ``final.pt``, ``log.jsonl``, the corpus cache in
``--out``), with sentence pairs for data: the system's gettext catalogs of ``--lang`` (default de) or
``--data pairs.tsv``; ``--batch-size`` counts pairs.  Not for seq2seq: ``--compile``, ``--seq-len`` and
``--val-fraction`` (a pair is bounded by the space's ``max_seq_len``; the split is 80/10/10 by catalog or line).
Under ``torchrun`` it trains data-parallel (DDP), as the LM run.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

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
    from supernet.seq2seq_train import load_seq2seq_supernet
    from supernet.train import TrainConfig
    from supernet.translation import DEFAULT_LANG

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
    from supernet.seq2seq import Seq2SeqSuperTransformer
    from supernet.seq2seq_train import Seq2SeqSandwich, train_seq2seq
    from supernet.translation import DEFAULT_LANG, check_pairs, prepare_pairs

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
    objective = Seq2SeqSandwich(space, seed=config.seed, **objective_dict)
    log.info("space %s: %s parameters in the largest subnet; batch %d pairs on %s", space.name,
             f"{model.num_params(space.largest()):,}", config.batch_size, device)  # fmt: skip
    meta = {**data, "val_fraction": None, "lang": lang, "corpus": corpus.meta["corpus"], "corpus_hash": corpus.hash,
            "corpus_sizes": sizes, "corpus_dir": str(corpus.path.relative_to(out))}  # fmt: skip
    state = stored["state"] if stored else {}
    bar, update = _step_bar(config, state.get("step", 0), state.get("elapsed", 0.0)) if dist.is_main else (None, None)
    try:
        result = train_seq2seq(model, objective, corpus.train, corpus.val, config, out=out, meta=meta, resume=stored,
                               progress=update, report=log.info, dist=dist)  # fmt: skip
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

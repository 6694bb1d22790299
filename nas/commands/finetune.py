"""``nas finetune``: train an exported model further, optionally distilled from the supernet's largest subnet.

Inherited weights are a starting point; a few thousand steps on the model alone usually lower
its loss.  ``--out DIR2`` becomes a new model directory (same layout as ``nas export``, card
with bits per byte before and after); its ``finetune/`` folder holds ``latest.pt`` (every
``--ckpt-interval`` steps, on Ctrl-C and at the end), ``log.jsonl`` and the corpus cache.
``--resume`` continues a killed or interrupted run exactly.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger(__name__)

NAME = "finetune"
HELP = "train an exported model further (optionally distilled from the supernet); resumable; writes a new model directory"
EXAMPLE = "nas finetune --model runs/export --out runs/finetuned --supernet runs/tiny/latest.pt --distill 0.5 --max-time 10m"

RUN_DIR = "finetune"
# Fine-tuning defaults: a tenth of train-supernet's learning rates, a short warm-up.
DEFAULTS = {"lr": 3e-4, "min_lr": 3e-5, "warmup_steps": 20, "max_steps": 500, "eval_interval": 100, "ckpt_interval": 100}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from nas.commands.train_supernet import parse_duration

    p.add_argument(
        "--model", required=True, metavar="DIR", help="model directory written by `nas export` (or a previous finetune)"
    )
    p.add_argument(
        "--out", required=True, metavar="DIR2", help="new model directory (its finetune/ folder holds checkpoints and logs)"
    )
    p.add_argument(
        "--supernet", metavar="CKPT", help="distil from this supernet's largest subnet (the checkpoint the model came from)"
    )
    p.add_argument(
        "--distill", type=float, metavar="W", help="weight of the teacher's soft targets, 0..1 (default 0.5 with --supernet)"
    )
    p.add_argument(
        "--data", metavar="PATH", help="text file, directory or glob (default: the Python standard library, as train-supernet)"
    )
    p.add_argument(
        "--data-seed", type=int, default=0, help="seed of the train/validation split by document (default 0, as train-supernet)"
    )
    p.add_argument("--val-fraction", type=float, default=0.05, help="share of bytes held out (default 0.05, as train-supernet)")
    p.add_argument(
        "--max-steps", type=int, help=f"total steps and the schedule's length (default {DEFAULTS['max_steps']} unless --max-time)"
    )
    p.add_argument("--max-time", type=parse_duration, metavar="T", help="stop after T of training in total (600, 90s, 10m)")
    p.add_argument("--batch-size", type=int, default=16, help="windows per step (default 16)")
    p.add_argument("--seq-len", type=int, default=128, help="window length in bytes (default 128)")
    p.add_argument("--lr", type=float, default=DEFAULTS["lr"], help=f"peak learning rate (default {DEFAULTS['lr']:g})")
    p.add_argument(
        "--min-lr", type=float, default=DEFAULTS["min_lr"], help=f"final learning rate (default {DEFAULTS['min_lr']:g})"
    )
    p.add_argument(
        "--warmup", type=int, default=DEFAULTS["warmup_steps"], help=f"warm-up steps (default {DEFAULTS['warmup_steps']})"
    )
    p.add_argument("--eval-interval", type=int, default=DEFAULTS["eval_interval"], help="validate every N steps (default 100)")
    p.add_argument("--eval-batches", type=int, default=16, help="validation batches per evaluation during training (default 16)")
    p.add_argument(
        "--ckpt-interval", type=int, default=DEFAULTS["ckpt_interval"], help="write latest.pt every N steps (default 100)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the batches (default 0)")
    p.add_argument("--format", default="torch", help="what to write: torch (safetensors + model.pt2), onnx (default torch)")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its finetune/latest.pt, exactly")


def _progress_bar(config, step: int, elapsed: float):
    from nas.commands.train_supernet import _step_bar

    bar, update = _step_bar(config, step, elapsed)
    bar.set_description("finetune")
    return bar, update


def run(args: argparse.Namespace) -> int:
    import torch

    from nas.export import Scoring, parse_formats, validation_bpb, write_model
    from search_spaces import UserError
    from supernet import extract, load_model
    from supernet.artifact import WEIGHTS, card_space, read_card, sha256_file
    from supernet.data import check_corpus, prepare_corpus
    from supernet.train import Distilled, DistillObjective, PlainObjective, StaticCheckpointer, TrainConfig, train

    formats = parse_formats(args.format)
    if args.distill is not None and not args.supernet:
        raise UserError("--distill: needs --supernet CKPT (the teacher is the supernet's largest subnet)")
    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads: {args.threads} is not a positive integer")
        torch.set_num_threads(args.threads)
    src, out = Path(args.model), Path(args.out)
    if src.resolve() == out.resolve():
        raise UserError(f"--out {out}: is the source model directory; choose a new directory")
    card = read_card(src)
    student = load_model(src).train()
    space = card_space(src, card)
    subnet = student.subnet
    run_dir = out / RUN_DIR
    checkpointer = StaticCheckpointer(space, subnet)
    source_digest = sha256_file(src / WEIGHTS)
    stored = None
    if args.resume:
        if not (run_dir / "latest.pt").exists():
            raise UserError(f"--resume: {run_dir} holds no checkpoint (latest.pt); start a new run without --resume")
        stored = checkpointer.load(run_dir / "latest.pt")
        meta = stored["meta"]
        if meta.get("source_weights") != source_digest:
            raise UserError(
                f"--model {src}: not the model this run started from ({run_dir / 'latest.pt'} was fine-tuned from "
                f"{meta.get('source')})"
            )
    elif (run_dir / "latest.pt").exists():
        raise UserError(
            f"--out {out}: already holds a fine-tuning run ({run_dir / 'latest.pt'}); add --resume to continue it, or choose "
            "another --out"
        )

    if stored is None:
        max_steps = args.max_steps or (None if args.max_time else DEFAULTS["max_steps"])
        config = TrainConfig(
            batch_size=args.batch_size,
            seq_len=min(args.seq_len, space.max_seq_len),
            lr=args.lr,
            min_lr=args.min_lr,
            warmup_steps=args.warmup,
            max_steps=max_steps,
            max_time=args.max_time,
            eval_interval=args.eval_interval,
            eval_batches=args.eval_batches,
            ckpt_interval=args.ckpt_interval,
            seed=args.seed,
        )
        data = {"data": args.data, "data_seed": args.data_seed, "val_fraction": args.val_fraction}
        distill = (0.5 if args.distill is None else args.distill) if args.supernet else None
        teacher_path = str(args.supernet) if args.supernet else None
    else:  # a resumed run keeps its settings; only its bounds may change
        bounds = {k: v for k, v in (("max_steps", args.max_steps), ("max_time", args.max_time)) if v is not None}
        config = TrainConfig.from_dict({**stored["meta"]["train_config"], **bounds})
        data = {k: stored["meta"][k] for k in ("data", "data_seed", "val_fraction")}
        distill, teacher_path = stored["meta"]["distill"], stored["meta"]["teacher"]
        if (args.supernet or teacher_path) and str(args.supernet or "") != str(teacher_path or ""):
            raise UserError(
                f"--supernet: a resumed run keeps its teacher ({teacher_path or 'none'}); got {args.supernet or 'none'}"
            )

    teacher = None
    if teacher_path:
        from supernet.checkpoint import load_supernet

        supernet, _ = load_supernet(teacher_path, space)
        teacher = extract(supernet, space.largest()).eval()
        del supernet
    model = Distilled(student, teacher)
    objective = DistillObjective(model, distill) if teacher is not None else PlainObjective()

    if data["data"] is not None and stored is None:
        from supernet.data import absolute_data

        data["data"] = absolute_data(data["data"])
    corpus = prepare_corpus(data["data"], run_dir, data["data_seed"], data["val_fraction"])
    if stored is not None:
        check_corpus(corpus, stored["meta"]["corpus_hash"], str(run_dir / "latest.pt"))
    where = (
        f"validation split of {data['data'] or 'the default corpus'} (seed {data['data_seed']}, fraction {data['val_fraction']})"
    )
    before = stored["meta"]["bpb_before"] if stored is not None else validation_bpb(student, space, corpus.val, Scoring(), where)
    meta = {**data, "source": str(src), "source_weights": source_digest, "teacher": teacher_path, "distill": distill,
            "corpus_hash": corpus.hash, "bpb_before": before}
    log.info(
        "fine-tuning %s (%s parameters) from %s: %.4f bits/byte%s",
        subnet,
        f"{student.num_params():,}",
        src,
        before["bits_per_byte"],
        f"; distilled from the largest subnet of {teacher_path} (weight {distill})" if teacher is not None else "",
    )
    state = stored["state"] if stored is not None else {}
    bar, update = _progress_bar(config, state.get("step", 0), state.get("elapsed", 0.0))
    try:
        result = train(model, objective, corpus.train, corpus.val, config, out=run_dir, checkpointer=checkpointer, meta=meta,
                       resume=stored if stored is not None else False, progress=update, report=log.info)
    finally:
        bar.close()
    if result.stopped == "interrupted":
        print(
            f"interrupted at step {result.step}; saved {result.checkpoint}. Continue with: nas finetune --model {src} --out "
            f"{out} --resume"
        )
        return 130
    student.eval()
    after = validation_bpb(student, space, corpus.val, Scoring(), where)
    new_card = {k: card[k] for k in ("source", "latency") if k in card}
    new_card.update(
        validation=after,
        finetune={
            "from": str(src),
            "steps": result.step,
            "tokens": result.tokens,
            "seconds": round(result.elapsed, 1),
            "stopped": result.stopped,
            "teacher": teacher_path,
            "distill": distill,
            "train_config": config.to_dict(),
            "data": data,
            "corpus_hash": corpus.hash,
            "bits_per_byte_before": before["bits_per_byte"],
            "bits_per_byte_after": after["bits_per_byte"],
        },
    )
    written = write_model(student, space, out, formats=formats, card=new_card, seed=args.seed)
    print(
        f"trained {result.step} steps ({result.tokens:,} tokens); validation bits/byte {before['bits_per_byte']:.4f} -> "
        f"{after['bits_per_byte']:.4f}"
    )
    print(f"wrote {out} (load: supernet.load_model({str(out)!r})" + (", model.pt2" if written.program_path else "")
          + (", model.onnx" if written.onnx_path else "") + f"); checkpoints and log in {run_dir}")
    return 0

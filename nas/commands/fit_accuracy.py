"""``nas fit-accuracy``: a ranker calibrated on retrained models, for ``nas search --fitness calibrated:DIR``.

Each MODEL is a folder of ``nas train-subnet`` (a subnet of the supernet's space trained from scratch).  Every model
is scored on the search's fitness windows (the supernet's validation split: ``--val-windows``, ``--seq-len``,
``--val-seed``, as ``nas search`` takes them) twice: with its own weights (the target) and with the supernet's
(a feature).  An encoder-decoder (task seq2seq) is scored as its search scores it: cross-entropy per target byte on
``--val-windows`` batches of ``--eval-batch-size`` validation pairs.  The ranker (nas/search/calibrated.py) predicts
the retrained loss from the subnet's attention types, size and inherited loss (over both stacks of an encoder-decoder);
the feature set is chosen by leave-one-out error, reported per model.  Writes
``ranker.json`` (coefficients: loading it runs no code), ``ranker.csv`` and ``ranker.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from .registry import register_command

NAME = "fit-accuracy"
HELP = "fit a ranker of subnets on retrained models' validation loss (for nas search --fitness calibrated:DIR)"
EXAMPLE = "nas fit-accuracy runs/long/latest.pt runs/retrained/* --val-windows 32 --seq-len 1024 --out runs/ranker"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from nas.commands.common import add_scoring_arguments

    p.add_argument("supernet", help="the supernet checkpoint the search ranks with (its inherited loss is a feature)")
    p.add_argument("models", nargs="+", metavar="MODEL", help="folders of `nas train-subnet` (at least 4; 10+ across the types)")
    p.add_argument("--out", required=True, metavar="DIR", help="where ranker.json, ranker.csv and ranker.png go")
    f = p.add_argument_group("the search's fitness windows (give the same values to nas search)")
    add_scoring_arguments(f)
    f.add_argument("--eval-batch-size", type=int, default=16, metavar="N", help="windows per forward pass (default 16)")
    p.add_argument("--device", default="auto", help="compute device of the scoring: auto (GPU when there is one), cpu, "
                   "cuda, cuda:N")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from latency.quantize import check_precision
    from nas.commands.common import file_digest, scoring_settings
    from nas.search import pick_device, task_fitness
    from nas.search.calibrated import Retrained, fit_ranker, report_text
    from search_spaces import UserError, tasks
    from supernet.checkpoint import load_supernet

    if check_precision(args.precision) != "fp32":
        raise UserError("--precision: the ranker is fitted at fp32 only (for now)")
    device = pick_device(args.device)
    supernet, payload = load_supernet(args.supernet, device=device)
    space = supernet.space
    task = tasks.of(space)
    # the search's fitness, as `nas search` builds it from the same flags (an encoder-decoder's: pairs, not windows)
    fitness, digest = task_fitness(supernet, payload, scoring_settings(args, device))
    models = []
    for folder in map(Path, dict.fromkeys(args.models)):
        model_space, subnet, model = task.load_trained(folder, device)
        if model_space.arch_hash != space.arch_hash:
            raise UserError(f"{folder}: a model of space {model_space.name!r} (hash {model_space.hash}), not of the "
                            f"supernet's {space.name!r} ({space.hash})")
        retrained = fitness.static(model)  # fp32, as the search scores
        inherited = float(fitness([subnet])[0])
        if not (np.isfinite(retrained) and np.isfinite(inherited)):
            raise UserError(f"{folder}: a loss that is not finite (retrained {retrained}, inherited {inherited})")
        models.append(Retrained(folder.name, subnet, supernet.num_params(subnet), inherited, float(retrained)))
        print(f"{folder}: retrained {retrained:.4f}, inherited {inherited:.4f} {task.unit}  {subnet}")
    ranker = fit_ranker(space, models, {**fitness.description, "data": digest}, file_digest(Path(args.supernet)))
    out = Path(args.out)
    ranker.save(out)
    write_table(out, ranker, space.subnet_type)
    plot(out / "ranker.png", ranker, task.metric or task.unit, fitness.summary)
    print(report_text(ranker))
    from nas.commands.common import emit

    emit(args, {"ranker": str(out / "ranker.json"), "kind": ranker.kind, "report": ranker.report,
                "models": [{"name": m.name, "params": m.params, "inherited": m.inherited, "retrained": m.retrained,
                            "key": m.subnet.key} for m in models]})
    print(f"wrote {out / 'ranker.json'}, ranker.csv, ranker.png; search with: nas search {args.supernet} "
          f"--fitness calibrated:{out} --val-windows {args.val_windows} --seq-len {args.seq_len} --val-seed {args.val_seed}")
    return 0


def write_table(out: Path, ranker, subnet_type) -> None:
    from supernet.files import atomic_write_csv

    loo = ranker.report["candidates"][ranker.kind]["loo"]
    rows = [{"model": m["name"], "subnet": str(subnet_type.from_dict(m["subnet"])), "params": m["params"],
             "inherited": f"{m['inherited']:.5f}", "retrained": f"{m['retrained']:.5f}", "loo_predicted": f"{p:.5f}"}
            for m, p in zip(ranker.models, loo)]  # fmt: skip
    atomic_write_csv(out / "ranker.csv", list(rows[0]), rows)


def plot(path: Path, ranker, metric: str, scored_on: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from supernet.files import atomic_write

    y = [m["retrained"] for m in ranker.models]
    inh = [m["inherited"] for m in ranker.models]
    c = ranker.report["candidates"][ranker.kind]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    what = f"validation loss, {metric}"
    axes[0].scatter(inh, y)
    axes[0].set(xlabel=f"inherited {what}", ylabel=f"retrained {what}",
                title=f"inherited weights (Kendall tau {ranker.report['inherited_tau']:.3f})")
    axes[1].scatter(c["loo"], y)
    lo, hi = min(min(y), min(c["loo"])), max(max(y), max(c["loo"]))
    axes[1].plot([lo, hi], [lo, hi], color="grey", linewidth=1)
    axes[1].set(xlabel=f"ranker's leave-one-out prediction ({ranker.kind})", ylabel=f"retrained {what}",
                title=f"calibrated: LOO MAE {c['loo_mae']:.3f}, tau {c['loo_tau']:.3f}")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"{len(y)} retrained models, scored on {scored_on}", fontsize=10)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


register_command(__name__)

"""Training curves for the benchmark scripts: each model's training loss per logged step, as CSV and as a plot.

A run of the one training loop logs ``{"event": "train", "step", "loss": {pass: nats}, "elapsed", ...}`` lines to its
``log.jsonl`` every ``log_interval`` steps (:class:`supernet.train.JsonlLog`); :func:`read_log` reads them back,
:func:`curve_from_progress` collects the same points from the loop's progress callback where a run keeps no log (LRA's
workers).  :func:`write_curves` writes one CSV of every model's points (``model, step, elapsed_s, loss``; the loss is
the mean over the step's passes, in nats), :func:`plot_curves` one PNG with a line per model, so a reader sees whether
a model was still learning when its training stopped.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Callable

FIELDS = ("model", "step", "elapsed_s", "loss")


def read_log(path: str | Path) -> list[dict[str, float]]:
    """The training points of one run's ``log.jsonl``: ``[{step, elapsed_s, loss}]`` in step order (a resumed run's
    log holds each step once; a torn last line is skipped; no file: no points)."""
    path = Path(path)
    if not path.is_file():
        return []
    points = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == "train" and isinstance(event.get("loss"), dict) and event["loss"]:
            losses = list(event["loss"].values())
            points.append({"step": int(event["step"]), "elapsed_s": float(event.get("elapsed", math.nan)),
                           "loss": float(sum(losses) / len(losses))})
    return sorted(points, key=lambda p: p["step"])


def curve_from_progress(points: list[dict[str, float]], every: int) -> Callable[[Any], None]:
    """A progress callback (:class:`supernet.train.StepInfo`) that appends a point to ``points`` every ``every`` steps."""

    def progress(info: Any) -> None:
        if info.step % max(1, every) == 0 or info.step == info.max_steps:
            losses = list(info.losses.values())
            points.append({"step": int(info.step), "elapsed_s": round(float(info.elapsed), 3),
                           "loss": float(sum(losses) / len(losses))})

    return progress


def write_curves(curves: dict[str, list[dict[str, float]]], path: str | Path) -> Path:
    """Every model's points (``curves``: model name -> points) as one CSV of :data:`FIELDS`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for name, points in curves.items():
            for p in points:
                w.writerow([name, p["step"], f"{p['elapsed_s']:.3f}", f"{p['loss']:.5f}"])
    return path


def read_curves(path: str | Path) -> dict[str, list[dict[str, float]]]:
    """A CSV of :func:`write_curves` read back (model name -> points)."""
    out: dict[str, list[dict[str, float]]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(row["model"], []).append({"step": int(row["step"]), "elapsed_s": float(row["elapsed_s"]),
                                                     "loss": float(row["loss"])})
    return out


def plot_curves(curves: dict[str, list[dict[str, float]]], path: str | Path, title: str, x: str = "step",
                panel: Callable[[str], str] | None = None) -> Path | None:
    """One line per model of its training loss against ``x`` (``step`` or ``elapsed_s``); None when no model has points.

    ``panel`` maps a model's name to its panel's title (a task, say): one panel per distinct title, each with its own
    legend and loss scale, in place of one axis that overlays every model."""
    curves = {k: v for k, v in curves.items() if v}
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, dict[str, list[dict[str, float]]]] = {}
    for name, points in curves.items():
        groups.setdefault(panel(name) if panel else "", {})[name] = points
    cols = min(3, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(9 if cols == 1 else 5.2 * cols, 5.5 if rows == 1 else 4.2 * rows),
                             squeeze=False)
    for ax, (label, members) in zip(axes.flat, groups.items()):
        for name, points in members.items():
            ax.plot([p[x] for p in points], [p["loss"] for p in points], linewidth=1, label=name)
        ax.set_xlabel("training step" if x == "step" else "training seconds")
        ax.set_ylabel("training loss (nats, mean over the step's passes)", fontsize=8 if panel else None)
        if label:
            ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
        if len(members) <= 24:
            ax.legend(fontsize=6, ncol=2 if len(members) > 6 else 1)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    if panel:
        fig.suptitle(title, fontsize=10)
    else:
        axes[0][0].set_title(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

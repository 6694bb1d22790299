"""Pareto fronts of (loss, latency) points, 2-D hypervolume, and the CSV and PNG of a search.

Both objectives are minimised.  ``points`` are arrays of shape (N, 2): column 0 the
validation loss, column 1 the latency in ms.  The study holds the same two objectives, so Optuna's
``study.best_trials`` is this front of its trials (``tests/nas/test_dashboard.py`` checks they agree); these functions
stay because the strategies and reports work on arrays of points (a generation, a CSV), and Optuna's own sorting
and hypervolume are private API (``optuna.study._multi_objective``, ``optuna._hypervolume``).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Sequence

import numpy as np

from supernet.files import atomic_savefig, atomic_write_csv


def dominates(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.all(a <= b) and np.any(a < b))


def non_dominated_sort(points: np.ndarray) -> list[np.ndarray]:
    """Fronts as index arrays, best first (fast non-dominated sort, O(M N^2))."""
    points = np.asarray(points, dtype=np.float64)
    n = len(points)
    if n == 0:
        return []
    le = np.all(points[:, None, :] <= points[None, :, :], axis=2)  # (N, N): i <= j everywhere
    lt = np.any(points[:, None, :] < points[None, :, :], axis=2)  # (N, N): i < j somewhere
    dom = le & lt  # dom[i, j]: i dominates j
    count = dom.sum(axis=0)  # how many dominate each point
    fronts, current = [], np.flatnonzero(count == 0)
    while len(current):
        fronts.append(current)
        count = count - dom[current].sum(axis=0)
        count[np.concatenate(fronts)] = -1
        current = np.flatnonzero(count == 0)
    return fronts


def pareto_front(points: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated points, sorted by latency (then loss)."""
    points = np.asarray(points, dtype=np.float64)
    if len(points) == 0:
        return np.zeros(0, dtype=np.int64)
    front = non_dominated_sort(points)[0]
    return front[np.lexsort((points[front, 0], points[front, 1]))]


def crowding_distance(points: np.ndarray) -> np.ndarray:
    """NSGA-II crowding distance of each point of one front (inf at the ends of each objective)."""
    points = np.asarray(points, dtype=np.float64)
    n = len(points)
    dist = np.zeros(n)
    if n <= 2:
        return np.full(n, np.inf)
    for m in range(points.shape[1]):
        order = np.argsort(points[:, m], kind="stable")
        span = points[order[-1], m] - points[order[0], m]
        dist[order[0]] = dist[order[-1]] = np.inf
        if span > 0 and np.isfinite(span):
            dist[order[1:-1]] += (points[order[2:], m] - points[order[:-2], m]) / span
    return dist


def hypervolume(points: np.ndarray, reference: Sequence[float]) -> float:
    """Area dominated by ``points`` and bounded by ``reference`` (loss, ms); points beyond it count 0."""
    points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    ref = np.asarray(reference, dtype=np.float64)
    inside = points[np.all(points < ref, axis=1)]
    if len(inside) == 0:
        return 0.0
    front = inside[pareto_front(inside)]  # latency ascending, loss descending
    # sweep over latency: each front point owns the strip from its latency to the next one's
    edges = np.append(front[:, 1], ref[1])
    area = float(np.sum((edges[1:] - edges[:-1]) * (ref[0] - front[:, 0])))
    return float(area)


# --------------------------------------------------------------------------- files

CSV_FIELDS = ["trial", "budget", "generation", "loss_bpb", "latency_ms", "params", "on_front", "key", "subnet"]


def write_csv(path: str | Path, rows: list[dict], fields: Sequence[str] = CSV_FIELDS) -> Path:
    """Every evaluated point, one row each (``on_front`` marks the Pareto front); ``fields``: the columns."""
    return atomic_write_csv(path, list(fields), ({k: row.get(k, "") for k in fields} for row in rows))


def loss_label(metric: str, fitness: dict) -> str:
    """What a search's loss is and what it was scored on, from its fitness description (``search.json``'s
    ``config.fitness``): ``bits/byte on 16 held-out windows x 128 tokens (inherited weights)``."""
    if "windows" in fitness:
        scope = f"{fitness['windows']} held-out windows x {fitness.get('seq_len', '?')} tokens"
    elif "examples" in fitness:
        scope = f"{fitness['examples']} held-out examples"
    else:
        scope = "held-out data"
    if "ranker" in fitness:
        return f"retrained {metric} predicted by the ranker (from {scope})"
    return f"{metric} on {scope} (inherited weights)"


def plot_png(
    path: str | Path, points: np.ndarray, budgets_ms: Sequence[float], best: dict[str, tuple[float, float]], title: str,
    *, limits_ms: Sequence[float] = (), measured: Sequence[dict] = (), ylabel: str = "validation loss (bits per byte)",
    device: str = "the device", baselines: Sequence[dict] = (),
) -> Path:
    """Every evaluated point, the front as a step line, a vertical line per budget, the best per budget (a star, on
    top of everything and in the legend).

    ``limits_ms``: where the search itself stopped below a budget (``--margin``), a dotted line each;
    ``measured``: candidates timed on ``device`` (``verify.json`` checks: ``loss_bpb``, ``predicted_ms``,
    ``measured_ms``, ``holds``), each drawn at its measured latency with a segment from its predicted one;
    ``baselines``: hand-scaled models to compare with (``name``, ``latency_ms``, ``loss``: on the figure's axes),
    a labelled square each.
    """
    fig = pareto_figure(points, budgets_ms, best, title, limits_ms=limits_ms, measured=measured, ylabel=ylabel,
                        device=device, baselines=baselines)
    import matplotlib.pyplot as plt

    atomic_savefig(fig, path)
    plt.close(fig)
    return Path(path)


def pareto_figure(
    points: np.ndarray, budgets_ms: Sequence[float], best: dict[str, tuple[float, float]], title: str,
    *, limits_ms: Sequence[float] = (), measured: Sequence[dict] = (), ylabel: str = "validation loss (bits per byte)",
    device: str = "the device", baselines: Sequence[dict] = (),
):
    """The matplotlib figure :func:`plot_png` saves (tests read its artists back)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    finite = np.all(np.isfinite(points), axis=1)
    ax.scatter(points[finite, 1], points[finite, 0], s=6, alpha=0.35, color="tab:gray", label=f"evaluated ({finite.sum()})")
    front = points[finite][pareto_front(points[finite])] if finite.any() else points[:0]
    if len(front):
        ax.step(
            front[:, 1],
            front[:, 0],
            where="post",
            color="tab:blue",
            lw=1.5,
            marker="o",
            ms=3,
            label=f"Pareto front ({len(front)})",
        )
    for i, b in enumerate(budgets_ms):
        ax.axvline(b, color="tab:red", ls="--", lw=1, label="budget" if i == 0 else None)
    for i, b in enumerate(limits_ms):
        ax.axvline(b, color="tab:red", ls=":", lw=1, label="search limit (budget less the margin)" if i == 0 else None)
    checks = [m for m in measured if np.isfinite(m["measured_ms"]) and np.isfinite(m["loss_bpb"])]
    for i, m in enumerate(checks):
        ax.plot([m["predicted_ms"], m["measured_ms"]], [m["loss_bpb"], m["loss_bpb"]], color="tab:green", lw=0.8, alpha=0.6)
    for holds, color, what in ((True, "tab:green", "holds"), (False, "tab:red", "over the budget")):
        sel = [m for m in checks if bool(m["holds"]) == holds]
        if sel:
            ax.scatter([m["measured_ms"] for m in sel], [m["loss_bpb"] for m in sel], marker="D", s=22, color=color,
                       zorder=6, label=f"measured on {device}, {what} ({len(sel)})")
    shown = [b for b in baselines if np.isfinite(b["latency_ms"]) and np.isfinite(b["loss"])]
    if shown:
        ax.scatter([b["latency_ms"] for b in shown], [b["loss"] for b in shown], marker="s", s=26, color="tab:purple",
                   edgecolor="white", linewidth=0.6, zorder=7, label=f"uniform baselines ({len(shown)})")
        for b in shown:
            ax.annotate(b["name"], (b["latency_ms"], b["loss"]), textcoords="offset points", xytext=(4, -9), fontsize=7,
                        color="tab:purple")
    xs = points[finite, 1]
    middle = float((xs.min() + xs.max()) / 2) if len(xs) else 0.0
    for i, (label, (loss, ms)) in enumerate(best.items()):
        # on top of the front, the measured diamonds and the baselines, and in the legend
        ax.scatter([ms], [loss], marker="*", s=160, color="tab:orange", edgecolor="black", linewidth=0.5, zorder=9,
                   label="best per budget (the found model)" if i == 0 else None)
        right = ms > middle  # the label on the side with room, inside the axes
        ax.annotate(f"best under {label}: {ms:.3f} ms predicted", (ms, loss), textcoords="offset points",
                    xytext=(-6 if right else 6, 8), ha="right" if right else "left", fontsize=8)
    ax.set_xlabel("predicted latency (ms)" if not checks else "latency (ms): predicted, and measured where marked")
    ax.set_ylabel("\n".join(textwrap.wrap(ylabel, 42)), fontsize=9)
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=9)  # long device descriptions wrap instead of running off
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def plot_search(out: str | Path, *, measured: bool = False) -> Path:
    """``out/pareto.png`` of a finished search from its files: the points of ``pareto.csv``, the budgets, limits, title
    and best of ``search.json`` and, with ``measured``, the candidates ``verify.json`` timed on the device."""
    import csv
    import json

    out = Path(out)
    summary = json.loads((out / "search.json").read_text())
    figure = summary.get("figure", {})
    with open(out / "pareto.csv", newline="") as f:
        points = np.array([[float(r["loss_bpb"]), float(r["latency_ms"])] for r in csv.DictReader(f)], dtype=np.float64)
    best = {label: (e["best"]["loss_bpb"], e["best"]["latency_ms"]) for label, e in summary["budgets"].items() if e.get("best")}
    checks, device = [], "the device"
    if measured and (out / "verify.json").exists():
        doc = json.loads((out / "verify.json").read_text())
        checks = [c for b in doc["budgets"].values() for c in b["checks"]]
        device = doc.get("device", {}).get("device") or device
    return plot_png(out / "pareto.png", points, figure.get("budgets_ms", []), best, figure.get("title", "search"),
                    limits_ms=figure.get("limits_ms", []), measured=checks,
                    ylabel=figure.get("ylabel", "validation loss (bits per byte)"), device=device)

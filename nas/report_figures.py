"""Figures ``nas report`` draws from a run's records (the others it embeds as the run saved them).

* :func:`learning_curve`: the supernet's training loss and held-out score per step, from its ``log.jsonl``;
* :func:`generations_figure`: the search's best loss per generation (and the best so far), from ``pareto.csv``.

The data functions (:func:`curves`, :func:`best_per_generation`) are pure, the figure functions return the
matplotlib figure (tests read its artists back), :func:`png` turns one into the bytes the page embeds.
"""

from __future__ import annotations

import io
import json
import math
import textwrap
from dataclasses import dataclass, field
from typing import Any, Iterable

MAX_POINTS = 4_000  # points of one curve drawn (a long run's are thinned evenly; the last one always kept)
MAX_EVENTS = 20_000  # lines of a log parsed, of its training lines and of the others each (thinned evenly)
METRICS = {"bpb": "bits/byte"}  # the log's names of held-out metrics, as the figures label them


@dataclass
class Curves:
    """A training log read: ``train[name]`` and ``held_out[name]`` as ``[(step, value)]``, the held-out metric's
    name (``bpb``), and the lines left out (not JSON objects, or not of the log's shape)."""

    train: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    held_out: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    metric: str = ""
    skipped: int = 0

    @property
    def empty(self) -> bool:
        return not any(self.train.values()) and not any(self.held_out.values())


PLOTTABLE = 1e12  # the largest magnitude a figure takes (matplotlib's transforms fail near 1e308)


def plottable(v: Any) -> bool:
    """A number a figure can place: finite and at most :data:`PLOTTABLE` in magnitude."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) <= PLOTTABLE


_number = plottable


def _every(lines: list[str], n: int) -> list[str]:
    """At most about ``n`` of ``lines``, evenly, the last one kept."""
    if len(lines) <= n:
        return lines
    stride = math.ceil(len(lines) / n)
    return lines[::stride] + ([lines[-1]] if (len(lines) - 1) % stride else [])


def curves(lines: Iterable[str]) -> Curves:
    """The curves of ``log.jsonl``'s lines: ``train`` events (``step``, ``loss: {subnet: nats}``) and ``eval`` events
    (``step``, ``<metric>: {subnet: score}``); any other line, or a field of another type, is counted as skipped.
    A long log's training lines (and, past :data:`MAX_EVENTS`, its others) are read evenly thinned: parsing every
    line of a 20-hour run would take longer than the curve is worth."""
    lines = list(lines)
    train = [line for line in lines if '"train"' in line]
    others = [line for line in lines if '"train"' not in line]
    out = Curves()
    for line in _every(train, MAX_EVENTS) + _every(others, MAX_EVENTS):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            out.skipped += 1
            continue
        if not isinstance(event, dict) or not _number(event.get("step")):
            out.skipped += 1
            continue
        kind, step = event.get("event"), float(event["step"])
        if kind == "train" and isinstance(event.get("loss"), dict):
            for name, v in event["loss"].items():
                if _number(v):
                    out.train.setdefault(str(name), []).append((step, float(v)))
        elif kind == "eval":
            scores = [(k, v) for k, v in event.items() if isinstance(v, dict)]
            for key, values in scores[:1]:
                out.metric = out.metric or key
                for name, v in values.items():
                    if _number(v) and key == out.metric:
                        out.held_out.setdefault(str(name), []).append((step, float(v)))
        elif kind not in ("start", "resume", "end", "checkpoint", "note", "type_passes"):
            out.skipped += 1
    return out


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= MAX_POINTS:
        return points
    stride = math.ceil(len(points) / MAX_POINTS)
    return points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])


def learning_curve(c: Curves):
    """Training loss (nats per token, as logged) and the held-out metric (bits/byte for the byte LMs) per step, one
    line per subnet the run logged (the sandwich's largest, smallest, ...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(c.train, "training loss (nats per token, as logged)"),
              (c.held_out, f"held-out {METRICS.get(c.metric, c.metric)} (lower is better)")]
    panels = [(series, label) for series, label in panels if any(series.values())]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.6), dpi=110, squeeze=False)
    for ax, (series, label) in zip(axes[0], panels):
        for name, points in sorted(series.items())[:12]:
            pts = _thin(points)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.2, marker="o" if len(pts) <= 30 else None, ms=3,
                    label=name[:40])
        ax.set_xlabel("step")
        ax.set_ylabel(label, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


@dataclass
class Generations:
    """Per budget: ``[(generation, best of that generation, best so far)]``; the rows left out, and why."""

    budgets: dict[str, list[tuple[int, float, float]]] = field(default_factory=dict)
    skipped: int = 0


def best_per_generation(rows: Iterable[dict[str, str]], limits_ms: dict[str, float]) -> Generations:
    """The best loss of each generation of each budget (``pareto.csv`` rows: ``budget``, ``generation``,
    ``loss_bpb``, ``latency_ms``), among points under the budget's limit (``limits_ms``, the search's own limit;
    a budget without one: every point), and the best so far; a row whose numbers do not read (or are not
    :func:`plottable`) is skipped."""
    best: dict[str, dict[int, float]] = {}
    skipped = 0
    for r in rows:
        try:
            budget, gen, loss, ms = str(r.get("budget", "")), int(r["generation"]), float(r["loss_bpb"]), float(r["latency_ms"])
        except (KeyError, TypeError, ValueError, OverflowError):
            skipped += 1
            continue
        if not (plottable(loss) and plottable(ms)) or not 0 <= gen <= PLOTTABLE:
            skipped += 1
            continue
        limit = limits_ms.get(budget, math.inf)
        if ms > limit * (1 + 1e-9):
            continue  # over the search's limit: not a candidate
        per = best.setdefault(budget, {})
        per[gen] = min(loss, per.get(gen, math.inf))
    out = Generations(skipped=skipped)
    for budget, per in best.items():
        so_far, line = math.inf, []
        for gen in sorted(per):
            so_far = min(so_far, per[gen])
            line.append((gen, per[gen], so_far))
        out.budgets[budget] = line
    return out


def generations_figure(g: Generations, ylabel: str):
    """The best loss of each generation (dots) and the best so far (a step line), one colour per budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
    for i, (budget, line) in enumerate(sorted(g.budgets.items())[:12]):
        color = f"C{i % 10}"
        gens = [p[0] for p in line]
        ax.plot(gens, [p[1] for p in line], "o", ms=4, color=color, alpha=0.5,
                label=f"{budget[:30]}: best of the generation")
        ax.step(gens, [p[2] for p in line], where="post", color=color, lw=1.6, label=f"{budget[:30]}: best so far")
    ax.set_xlabel("generation")
    ax.set_ylabel("\n".join(textwrap.wrap(ylabel, 42)), fontsize=9)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def png(fig) -> bytes:
    """``fig`` as PNG bytes (closed after)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png")
    finally:
        plt.close(fig)
    return buf.getvalue()

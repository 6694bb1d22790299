"""Agreement metrics between predicted (or re-measured) and measured latency, and the PNG."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from supernet.files import atomic_savefig


def latency_error_pct(measured_ms: float, predicted_ms: float) -> float:
    """The latency error, one sign everywhere (export, verify, the demo, scripts): (measured - predicted) / predicted,
    in percent.  Positive: the device is slower than predicted (a budget met by the predictor may be broken)."""
    return 100.0 * (measured_ms - predicted_ms) / predicted_ms


def agreement(pred: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """RMSE (ms), MAPE, share within +-5% and +-10% of measured, Kendall tau (unsigned fit metrics of a predictor;
    a single model's signed error is :func:`latency_error_pct`)."""
    pred, measured = np.asarray(pred, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    rel = np.abs(pred - measured) / measured
    tau = kendalltau(pred, measured).statistic if len(pred) > 1 else float("nan")
    return {
        "n": int(len(pred)),
        "rmse_ms": float(np.sqrt(np.mean((pred - measured) ** 2))),
        "mape": float(rel.mean()),
        "within_5": float((rel <= 0.05).mean()),
        "within_10": float((rel <= 0.10).mean()),
        "kendall_tau": float(tau),
    }


HEADER = f"{'':<28}{'n':>5}{'RMSE ms':>10}{'MAPE':>8}{'±5%':>8}{'±10%':>8}{'tau':>8}"


def format_row(label: str, m: dict[str, float]) -> str:
    return (
        f"{label:<28}{m['n']:>5}{m['rmse_ms']:>10.3f}{m['mape'] * 100:>7.2f}%"
        f"{m['within_5'] * 100:>7.1f}%{m['within_10'] * 100:>7.1f}%{m['kendall_tau']:>8.3f}"
    )


def log_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """At most ``n`` round tick values (two significant digits) in [lo, hi], about evenly spaced on a log scale."""
    if not (0 < lo < hi and np.isfinite(hi)):
        raise ValueError(f"log_ticks: needs 0 < lo < hi, got lo={lo!r}, hi={hi!r}")
    out: list[float] = []
    for v in np.geomspace(lo, hi, n + 2)[1:-1]:  # inside the range, clear of its ends
        r = float(f"{v:.2g}")
        if lo <= r <= hi and (not out or r / out[-1] > 1.15):  # rounding can bring two together: keep them apart
            out.append(r)
    return out


def plot(
    path: str | Path, measured: np.ndarray, pred: np.ndarray, title: str, retest: tuple[np.ndarray, np.ndarray] | None = None
) -> Path:
    """Predicted vs measured (log-log) with the +-10% band; optionally re-measured vs measured beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(6, 6), dpi=120)
    lo = min(measured.min(), pred.min()) * 0.9
    hi = max(measured.max(), pred.max()) * 1.1
    line = np.array([lo, hi])
    ax.plot(line, line, color="black", lw=1)
    ax.fill_between(line, line * 0.9, line * 1.1, color="grey", alpha=0.2, label="±10%")
    if retest is not None:
        ax.scatter(retest[0], retest[1], s=14, marker="x", color="tab:orange", label="re-measured (test-retest)")
    ax.scatter(measured, pred, s=12, color="tab:blue", label="predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = log_ticks(lo, hi)
    for axis in (ax.xaxis, ax.yaxis):  # a few plain numbers (not 2x10^1), spread evenly on the log scale, none overlapping
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_major_formatter(FormatStrFormatter("%g"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured latency (ms)")
    ax.set_ylabel("predicted / re-measured latency (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    atomic_savefig(fig, path)
    plt.close(fig)
    return path

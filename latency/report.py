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


NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)  # tick mantissas


def log_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """At most ``n`` round ticks (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 times a power of ten) in [lo, hi], spread about
    evenly on a log scale; in a range too narrow for three of them, two-digit values."""
    if not (0 < lo < hi and np.isfinite(hi)):
        raise ValueError(f"log_ticks: needs 0 < lo < hi, got lo={lo!r}, hi={hi!r}")
    powers = range(int(np.floor(np.log10(lo))) - 1, int(np.ceil(np.log10(hi))) + 1)
    nice = sorted(v for v in (float(f"{m * 10.0**k:.6g}") for k in powers for m in NICE) if lo <= v <= hi)
    if len(nice) < 3:  # a narrow range: two significant digits instead
        two = sorted({float(f"{v:.2g}") for v in np.geomspace(lo, hi, n + 2)[1:-1]})
        return [v for v in two if lo <= v <= hi][:: max(1, len(two) // n)] or nice
    if len(nice) <= n:
        return nice
    logs = np.log10(nice)
    want = np.linspace(logs[0], logs[-1], n)
    return sorted({nice[int(np.argmin(np.abs(logs - w)))] for w in want})


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

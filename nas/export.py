"""``nas export``: the chosen subnet's artifacts as its task writes them (:meth:`tasks.base.Task.export`), the
predictor's estimate and, with a timing target, the exported model timed on the device (both in the card).

The task writes and checks its files (a one-stack model: :mod:`tasks.stack.export`; the encoder-decoder:
:mod:`tasks.translation.export`) with the shared helpers of :mod:`supernet.export`; this workflow calls the task and
never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from latency import device as devices
from latency.measure import predicted_latency
from latency.predictors import load_predictor
from latency.quantize import check_predictor_precision
from search_spaces import UserError, tasks
from supernet.artifact import update_card
from supernet.export import Exported, ExportSettings


@dataclass
class ExportOutcome:
    exported: Exported
    predicted: dict[str, Any] | None = None
    workload: Any = None
    measured: dict[str, Any] | None = None


def export_chosen(supernet, payload: dict[str, Any], subnet, settings: ExportSettings,
                  progress: Callable[[int, int, str], None] | None = None) -> ExportOutcome:
    """``nas export``: the subnet's artifacts as its task writes them (:meth:`tasks.base.Task.export`), the predictor's
    estimate and, with ``settings.measure``, the exported model timed on the device (both in the card)."""
    space = supernet.space
    task = tasks.of(space)
    s = settings
    if s.budget_ms is not None and not s.measure:
        raise UserError("--budget: needs --timing-target DEVICE (the budget is checked against the measured latency)")
    predicted, reference_ms = None, None
    if s.predictor:
        predictor = load_predictor(s.predictor)
        check_predictor_precision(predictor, s.predictor, s.precision)
        predicted, reference_ms = predicted_latency(predictor, space, subnet, str(s.predictor)), predictor.reference_ms
    workload = device = None
    if s.measure:
        task.check_timing(space, s.measure, s.precision)
        workload = choose_workload(space, s.workload, predicted, default=task.default_workload)
        device = devices.get_device(s.measure, **{k: v for k, v in s.device_options.items() if v is not None},
                            precision=None if s.precision == "fp32" else s.precision)
    exported = task.export(supernet, payload, subnet, settings, predicted)
    outcome = ExportOutcome(exported, predicted, workload)
    if s.measure:
        assert exported.time is not None, f"task {task.name}: an export that cannot be timed"
        outcome.measured = exported.time(device, workload, s.protocol, budget_ms=s.budget_ms, seed=s.seed,
                                         baseline_ms=reference_ms, progress=progress,
                                         predicted_ms=predicted["predicted_ms"] if predicted else None)
        update_card(exported.out, measured=outcome.measured)
    return outcome


def choose_workload(space, name: str | None, predicted: dict | None, default: str | None = "prefill"):
    """``--workload``, else the predictor's, else ``default`` (None: the space's first); a predictor fitted at another
    workload is refused."""
    wanted = name or (predicted["workload"]["name"] if predicted else default)
    workload = space.workload(wanted)
    if predicted and predicted["workload"]["name"] != workload.name:
        raise UserError(f"--workload {workload.name}: the predictor was fitted at workload {predicted['workload']['name']!r}; "
                        "its estimate would not be comparable (drop --workload or use a predictor of that workload)")
    return workload

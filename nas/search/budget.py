"""Parsing what users type for constraints: latency budgets with units, parameter counts with suffixes.

``parse_budget("50ms") == 50.0``: budgets are carried in milliseconds everywhere.
Accepted units: ``us`` (also ``µs``), ``ms`` and ``s``; a bare number is refused, because
"50" could mean 50 ms or 50 s.  ``parse_budgets("20ms,50ms,100ms")`` reads a list.

Budgets on workloads (:func:`parse_workload_budgets`, :func:`budget_plans`): an entry is
``T`` (on the default workload) or ``NAME:T`` (on the space's workload ``NAME``, e.g.
``decode:5ms``).  Budgets on *different* workloads constrain one search together; several
budgets on *one* workload are a sweep, one search each.  So ``prefill:50ms,decode:5ms`` is one
search under both, and ``decode:5ms,decode:10ms,prefill:50ms`` is two (5 ms and 10 ms per
token, each also under 50 ms prefill): the searches are every combination of one budget per workload.
"""

from __future__ import annotations

import itertools
import math
import re
from decimal import Decimal

from search_spaces import UserError

UNITS_MS = {"us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3}
BUDGET_FORMS = "a positive number with a unit: 50ms, 0.05s, 800us (several: 20ms,50ms,100ms)"
COUNT_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}
COUNT_FORMS = "a positive whole number, optionally with a suffix: 1500000, 1.5M, 800k"
MAX_TOKENS = 10**12  # a token budget above this is a typo: 10^12 tokens is years of training at this tool's scale

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_BUDGET = re.compile(rf"^\s*({_NUMBER})\s*([a-zA-Zµ]*)\s*$")
_COUNT = re.compile(rf"^\s*({_NUMBER})\s*([a-zA-Z]?)\s*$")


def parse_budget(text: str, flag: str = "--budget") -> float:
    """One latency budget in milliseconds; a clear :class:`UserError` naming ``flag`` otherwise."""
    m = _BUDGET.match(str(text))
    if not m:
        raise UserError(f"{flag}: {text!r} is not a latency; write {BUDGET_FORMS}")
    value, unit = float(m.group(1)), m.group(2)
    if not unit:
        raise UserError(f"{flag}: {text!r} has no unit; write {BUDGET_FORMS}")
    if unit not in UNITS_MS:
        raise UserError(f"{flag}: {text!r}: unknown unit {unit!r} (use us, ms or s); write {BUDGET_FORMS}")
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"{flag}: {text!r} must be greater than zero; write {BUDGET_FORMS}")
    return value * UNITS_MS[unit]


def parse_budgets(text: str, flag: str = "--budget") -> list[float]:
    """A comma-separated list of budgets, in milliseconds, ascending; repeats are refused."""
    parts = [p for p in str(text).split(",")]
    if any(not p.strip() for p in parts):
        raise UserError(f"{flag}: {text!r} has an empty entry; write {BUDGET_FORMS}")
    budgets = [parse_budget(p, flag) for p in parts]
    labels = [format_ms(b) for b in budgets]
    repeated = sorted({lab for lab in labels if labels.count(lab) > 1})
    if repeated:
        raise UserError(f"{flag}: {text!r} repeats {', '.join(repeated)}; give each budget once")
    return sorted(budgets)


_WORKLOAD = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_-]*)\s*:(.*)$")


def parse_workload_budgets(text: str, default: str | None, flag: str = "--budget") -> dict[str, list[float]]:
    """``"prefill:50ms,decode:5ms"`` -> ``{"prefill": [50.0], "decode": [5.0]}`` (workloads in order of first
    mention, budgets ascending).  A bare ``T`` is on ``default``; without one it is refused, naming the forms."""
    parts = str(text).split(",")
    if any(not p.strip() for p in parts):
        raise UserError(f"{flag}: {text!r} has an empty entry; write {BUDGET_FORMS}, or NAME:T for a workload (decode:5ms)")
    out: dict[str, list[float]] = {}
    for part in parts:
        m = _WORKLOAD.match(part)
        name, value = (m.group(1), m.group(2)) if m else (default, part)
        if name is None:
            raise UserError(
                f"{flag}: {part.strip()!r} does not say its workload, and there is no default: write NAME:{part.strip()} "
                "(e.g. decode:5ms) or give --workload NAME"
            )
        out.setdefault(name, []).append(parse_budget(value, f"{flag} (workload {name})" if m else flag))
    for name, values in out.items():
        labels = [format_ms(b) for b in values]
        repeated = sorted({lab for lab in labels if labels.count(lab) > 1})
        if repeated:
            raise UserError(f"{flag}: {text!r} repeats {', '.join(repeated)} on workload {name}; give each budget once")
        out[name] = sorted(values)
    return out


def budget_plans(budgets: dict[str, list[float]]) -> list[dict[str, float]]:
    """One search per combination of one budget per workload: ``{workload: ms}`` each, in a stable order."""
    names = list(budgets)
    return [dict(zip(names, combo)) for combo in itertools.product(*(budgets[n] for n in names))]


def plan_label(plan: dict[str, float], named: bool) -> str:
    """``50ms`` when the search has one workload (``named`` False), else ``decode-5ms+prefill-50ms`` (also in file names)."""
    if not named:
        (ms,) = plan.values()
        return format_ms(ms)
    return "+".join(f"{name}-{format_ms(ms)}" for name, ms in sorted(plan.items()))


def format_ms(ms: float) -> str:
    """A short label for a budget in milliseconds: ``50ms``, ``0.8ms``, ``2.5s`` (also used in file names)."""
    if ms >= 1000 and (ms / 1000) == round(ms / 1000, 3):
        return f"{ms / 1000:g}s"
    return f"{ms:.6g}ms"


def parse_count(text: str, flag: str = "--max-params", what: str = "parameters", *, limit: int | None = None,
                forms: str = COUNT_FORMS, noun: str = "count") -> int:
    """A positive count of ``what`` such as ``1500000``, ``1.5M`` or ``800k`` (k, M, G: powers of 1000), read exactly
    (``Decimal``, never a float: ``12345678901234567891`` stays that number), at most ``limit`` when given."""
    m = _COUNT.match(str(text))
    suffix = m.group(2).lower() if m else ""
    if not m or suffix not in COUNT_SUFFIXES:
        raise UserError(f"{flag}: {str(text)[:40]!r} is not a {noun}; write {forms}")
    number = Decimal(m.group(1))
    if number <= 0:
        raise UserError(f"{flag}: {text!r} must be greater than zero; write {forms}")
    if limit is not None and number > Decimal(limit) / COUNT_SUFFIXES[suffix]:  # compared before anything is multiplied
        raise UserError(f"{flag}: {text!r} is above the limit of {limit:,} {what}")
    if number.adjusted() > 30:  # (Decimal's arithmetic on an exponent of a billion would overflow)
        raise UserError(f"{flag}: {text!r} is not a count of {what} that can be; write {forms}")
    value = number * COUNT_SUFFIXES[suffix]
    if number.adjusted() < -30 or value != value.to_integral_value():
        raise UserError(f"{flag}: {text!r} is not a whole number of {what}; write {forms}")
    return int(value)

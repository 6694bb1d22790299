"""Few-shot latency predictors: a new device from a few measured rows and the predictors of other devices.

The *sources* are fitted predictors of other devices at the same space and workload (or of plain
tables whose columns the new table has).  On the new device's few rows, leave-one-out
cross-validation chooses among small models that reuse them:

* ``scale``: one source's predictions times one factor (the geometric mean of measured / predicted);
* ``sources``: a non-negative combination of every source's predictions plus a constant (the
  per-layer additive model with the sources' predictions as its columns);
* ``terms``: a source's per-layer sum (its constant and each per-layer cost), every term rescaled on
  its own and pulled toward one common factor by a ridge of strength ``lam`` (one candidate per source
  and strength): the new device's cost of a term is the source's times that term's factor.  An additive
  source is its own sum; an MLP or boosted-trees source of subnets is first read as one (the additive
  model fitted to its predictions on a seeded pool of the space's subnets);
* ``scratch``: the additive model, and the layer-composed one (:mod:`.layered`, where the view has its ``cost:*``
  columns), on the few rows alone, so the choice shows when the sources do not help.

Every candidate ends as one :class:`Transfer`: a non-negative additive head on either the sources'
predictions (``scale``, ``sources``, and the layered ``scratch``: the unit head on that model fitted to the rows)
or feature columns (``terms``, the additive ``scratch``, where the source's costs are folded into the head).  It
saves as JSON settings plus arrays, the sources it reads embedded (a transferred predictor needs no other folder), and
loads without running code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import nnls

from search_spaces import Space, UserError, Workload

from ..report import agreement
from .additive import Additive
from .layered import Layered
from .models import MODELS, new_model
from .select import Selection

MIN_ROWS = 5  # the fewest measured rows a transfer fits from (one held out, leave-one-out on the others)
RIDGES = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)  # strengths of the pull of each term's factor toward the common one (``terms``)
BASE = MODELS  # a source's model, by kind (the registered predictor models)


@dataclass
class Source:
    """A source predictor's model and the columns of the input matrix it reads, in its own order."""

    label: str  # as the user named it (the --from folder)
    kind: str  # its model: mlp, gbt, additive, layered or transfer
    regressor: object
    index: np.ndarray  # (d_source,) column indices into the input matrix
    terms: Additive | None = None  # its per-layer sum (``terms`` candidates): itself if additive, else read from it
    terms_index: np.ndarray | None = None  # the columns ``terms`` reads

    def predict(self, x: np.ndarray) -> np.ndarray:
        # a learned source far outside its rows can overflow (an MLP's exp): keep it finite, leave-one-out judges it
        with np.errstate(over="ignore"):
            return np.clip(self.regressor.predict(x[:, self.index]), 1e-9, 1e9)


class Transfer:
    """A non-negative additive head on the sources' predictions or on columns of the input matrix."""

    kind = "transfer"

    def __init__(self, method: str, label: str, head: Additive, sources: Sequence[Source] = (), index=None):
        assert (len(sources) > 0) != (index is not None), "the head reads the sources' predictions or columns, not both"
        self.method, self.label, self.head = method, label, head
        self.sources, self.index = list(sources), None if index is None else np.asarray(index)

    def head_input(self, x: np.ndarray) -> np.ndarray:
        if self.sources:
            return np.column_stack([s.predict(x) for s in self.sources])  # (n, sources)
        return x[:, self.index]

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.head.predict(self.head_input(np.asarray(x, dtype=np.float64)))

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        head_meta, head_arrays = self.head.state()
        meta = {"method": self.method, "label": self.label, "head": head_meta, "sources": []}
        arrays = {f"head.{k}": v for k, v in head_arrays.items()}
        if self.index is not None:
            arrays["index"] = self.index
        for i, s in enumerate(self.sources):
            s_meta, s_arrays = s.regressor.state()
            meta["sources"].append({"label": s.label, "kind": s.kind, "state": s_meta})
            arrays.update({f"s{i}.{k}": v for k, v in s_arrays.items()})
            arrays[f"s{i}.index"] = s.index
        return meta, arrays

    @classmethod
    def from_state(cls, meta: dict, arrays: dict[str, np.ndarray]) -> "Transfer":
        def part(prefix: str) -> dict[str, np.ndarray]:
            return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}

        sources = []
        for i, s in enumerate(meta["sources"]):
            mine = part(f"s{i}.")
            index = mine.pop("index")
            model = (cls if s["kind"] == "transfer" else BASE[s["kind"]]).from_state(s["state"], mine)
            sources.append(Source(s["label"], s["kind"], model, index))
        head = Additive.from_state(meta["head"], part("head."))
        return cls(meta["method"], meta["label"], head, sources, arrays.get("index"))


# --------------------------------------------------------------------------- the candidates


def additive_head(coef: np.ndarray, names: list[str] | None = None) -> Additive:
    head = Additive(names)
    head.coef = np.asarray(coef, dtype=np.float64)
    return head


def fit_scale(source: Source, x: np.ndarray, y: np.ndarray) -> Transfer:
    factor = float(np.exp(np.mean(np.log(y) - np.log(np.maximum(source.predict(x), 1e-9)))))
    return Transfer("scale", f"scale {source.label}", additive_head([0.0, factor]), [source])


def fit_sources(sources: Sequence[Source], x: np.ndarray, y: np.ndarray) -> Transfer:
    head = Additive([s.label for s in sources]).fit(np.column_stack([s.predict(x) for s in sources]), y)
    return Transfer("sources", f"sources ({len(sources)})", head, sources)


def term_factors(contrib: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    """Non-negative factors ``a`` (d,) minimising sum_i ((contrib_i . a - y_i) / y_i)^2 + lam * sum_j (a_j - m)^2
    over ``a`` and a common factor ``m`` (both non-negative); terms no row exercises (all zero) get ``m``."""
    n, d = contrib.shape
    used = np.abs(contrib).max(axis=0) > 0
    k = int(used.sum())
    data = np.hstack([contrib[:, used] / y[:, None], np.zeros((n, 1))])  # (n, k + 1): the rows' relative errors
    pull = np.sqrt(lam) * np.hstack([np.eye(k), -np.ones((k, 1))])  # (k, k + 1): each factor toward m
    sol, _ = nnls(np.vstack([data, pull]), np.concatenate([np.ones(n), np.zeros(k)]), maxiter=50 * (k + 1))
    factors = np.full(d, sol[-1])
    factors[used] = sol[:k]
    return factors


def fit_terms(source: Source, x: np.ndarray, y: np.ndarray, lam: float) -> Transfer:
    """Rescale each term of a source's per-layer sum (its constant first) by its own factor, ridge-pulled to a common one."""
    model = source.terms
    contrib = Additive._with_const(x[:, source.terms_index]) * model.coef  # (n, 1 + d): each term's ms on the source device
    head = additive_head(model.coef * term_factors(contrib, y, lam), model.names)
    return Transfer("terms", f"terms {source.label} lam={lam:g}", head, index=source.terms_index)


def fit_scratch(index: np.ndarray, x: np.ndarray, y: np.ndarray) -> Transfer:
    return Transfer("scratch", "scratch additive", Additive().fit(x[:, index], y), index=index)


def fit_scratch_layered(index: np.ndarray, names: list[str], x: np.ndarray, y: np.ndarray) -> Transfer:
    """The layer-composed model on the rows alone (its ``cost:*`` columns ``index``, named ``names``), as a transfer
    of one source under the unit head."""
    model = new_model(Layered.kind, names).fit(x[:, index], y)
    return Transfer("scratch", "scratch layered", additive_head([0.0, 1.0]), [Source("scratch", Layered.kind, model, index)])


def candidates(
    sources: Sequence[Source], n_rows: int, scratch_index: np.ndarray | None,
    layered: tuple[np.ndarray, list[str]] | None = None,
) -> list[tuple[str, Callable[[np.ndarray, np.ndarray], Transfer]]]:
    """(label, fit(x, y) -> Transfer) of every candidate a table of ``n_rows`` training rows supports (``layered``: the
    view's layered columns and their names, for the layered scratch candidate)."""
    out = []
    for s in sources:
        out.append((f"scale {s.label}", lambda x, y, s=s: fit_scale(s, x, y)))
        if s.terms is not None:
            for lam in RIDGES:
                out.append((f"terms {s.label} lam={lam:g}", lambda x, y, s=s, lam=lam: fit_terms(s, x, y, lam)))
    if n_rows >= len(sources) + 3:  # a constant and one weight per source, with rows to spare
        out.append((f"sources ({len(sources)})", lambda x, y: fit_sources(sources, x, y)))
    if scratch_index is not None:
        out.append(("scratch additive", lambda x, y: fit_scratch(scratch_index, x, y)))
    if layered is not None and len(layered[0]):
        out.append(("scratch layered", lambda x, y: fit_scratch_layered(layered[0], layered[1], x, y)))
    return out


def leave_one_out(fit: Callable[[np.ndarray, np.ndarray], Transfer], x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    pred = np.empty_like(y)
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        pred[i] = fit(x[keep], y[keep]).predict(x[i : i + 1])[0]
    return agreement(pred, y)


def choose(
    sources: Sequence[Source],
    x: np.ndarray,
    y: np.ndarray,
    scratch_index: np.ndarray | None = None,
    on_candidate: Callable[[str, dict], None] | None = None,
    layered: tuple[np.ndarray, list[str]] | None = None,
) -> tuple[str, dict[str, dict[str, float]], Callable[[np.ndarray, np.ndarray], Transfer]]:
    """The candidate of lowest leave-one-out MAPE on (x, y): (its label, every candidate's agreement, its fit)."""
    cv, fits = {}, {}
    for label, fit in candidates(sources, len(y), scratch_index, layered):
        cv[label], fits[label] = leave_one_out(fit, x, y), fit
        if on_candidate is not None:
            on_candidate(label, cv[label])
    best = min(cv, key=lambda k: cv[k]["mape"])
    return best, cv, fits[best]


def fit_transfer(sources: Sequence[Source], x: np.ndarray, y: np.ndarray, scratch_index: np.ndarray | None = None,
                 layered: tuple[np.ndarray, list[str]] | None = None) -> Transfer:
    """Choose by leave-one-out on all rows and refit the choice on them (what a transfer without a held-out split does)."""
    _, _, fit = choose(sources, x, y, scratch_index, layered=layered)
    return fit(x, y)


def select_transfer(
    sources: Sequence[Source],
    x: np.ndarray,
    y: np.ndarray,
    test_mask: np.ndarray,
    *,
    scratch_index: np.ndarray | None = None,
    on_candidate: Callable[[str, dict], None] | None = None,
    layered: tuple[np.ndarray, list[str]] | None = None,
) -> Selection:
    """As :func:`latency.predictors.select.select`, but with rows too few to spare: choose by leave-one-out on *every*
    row (each row is held out once: an honest estimate per candidate), report the choice fitted without the rows of
    ``test_mask`` on them, and refit it on every row.  (Choosing on 16 of 20 rows instead picked worse methods on
    real timings: ``scripts/bench_fewshot.py``.)"""
    train = ~test_mask
    best, cv, fit = choose(sources, x, y, scratch_index, on_candidate, layered)
    pred = fit(x[train], y[train]).predict(x[test_mask])
    return Selection(best, cv, agreement(pred, y[test_mask]), pred, fit(x, y))


# --------------------------------------------------------------------------- the sources, checked


def source_columns(predictor, view_names: list[str]) -> list[str]:
    """The input columns (names of ``view_names``) a source predictor of subnets reads."""
    if predictor.name == "additive":
        terms = predictor.regressor.names or [n[len("sum:"):] for n in view_names if n.startswith("sum:")]
        return [f"sum:{n}" for n in terms]
    if predictor.name == Layered.kind:
        return [f"cost:{n}" for n in predictor.regressor.names or []]
    if predictor.name == Transfer.kind:
        return list(view_names)  # all of the view (one saved before the cost:* columns reads the columns before them)
    return [n for n in view_names if not n.startswith("cost:")]  # mlp, gbt: the encoding and summaries


def load_sources(
    paths: Sequence[str], space: Space | None, workload: Workload | None, view_names: list[str], table: str,
    load_predictor: Callable,
) -> list[Source]:
    """Load (``load_predictor``: :func:`latency.predictors.load_predictor`, which reads transfer predictors through this
    module) and check the ``--from`` predictors against the new table (``space`` None: a plain table of ``view_names``)."""

    if len(set(paths)) != len(paths):
        twice = sorted({p for p in paths if list(paths).count(p) > 1})
        raise UserError(f"--from: {', '.join(twice)} given twice; name each source predictor once")
    out = []
    for path in paths:
        p = load_predictor(path)
        where = f"--from {path}"
        if p.space is not None and space is None:
            raise UserError(
                f"{where}: a predictor of subnets of space {p.space.name!r}; {table} is a plain table (--target), whose rows "
                "are not subnets: a source for it must be fitted on a plain table (nas fit-predictor T.csv --target COLUMN)"
            )
        if p.space is not None:
            if p.space.arch_hash != space.arch_hash:
                raise UserError(
                    f"{where}: fitted on space {p.space.name!r} (hash {p.space.hash}); {table} holds subnets of space "
                    f"{space.name!r} (hash {space.hash}): a source must be of the same space"
                )
            if p.workload_spec != workload:
                raise UserError(
                    f"{where}: fitted at workload {p.workload_spec}; {table} holds timings of workload {workload}: "
                    "a source must be of the same workload"
                )
            needed = source_columns(p, view_names)
        else:
            needed = list(p.columns or [])
        missing = [n for n in needed if n not in view_names]
        if len(missing) == len(needed):
            raise UserError(
                f"{where}: no feature in common with {table} (the source reads {', '.join(needed[:6])}"
                f"{', ...' if len(needed) > 6 else ''}; the table has {', '.join(view_names[:6])}"
                f"{', ...' if len(view_names) > 6 else ''})"
            )
        if missing:
            raise UserError(
                f"{where}: reads column(s) {', '.join(missing)} that {table} lacks; "
                "a source must read only columns the new table has"
            )
        source = Source(str(path), p.name, p.regressor, np.array([view_names.index(n) for n in needed]))
        if p.name == "additive":
            source.terms, source.terms_index = p.regressor, source.index
        elif p.space is not None:
            source.terms, source.terms_index = read_as_terms(source, space, workload)
        out.append(source)
    return out


def read_as_terms(source: Source, space: Space, workload: Workload, pool: int = 400) -> tuple[Additive, np.ndarray]:
    """A learned source of subnets as a per-layer sum: the additive model fitted to its predictions on ``pool``
    seeded uniform subnets of the space (the columns it reads: the additive terms of the view)."""
    from ..sampling import campaign_subnets
    from .models import subnet_matrix

    x, names = subnet_matrix(Transfer.kind, space, workload, campaign_subnets(space, min(pool, space.size()), seed=0))
    cols = scratch_columns(space, names)
    terms = Additive([names[i][len("sum:"):] for i in cols]).fit(x[:, cols], source.predict(x))
    return terms, cols


def layered_columns(view_names: list[str]) -> tuple[np.ndarray, list[str]] | None:
    """The view's layer-composed columns (``cost:*``) and their names without the prefix (the layered model's own),
    for the layered ``scratch`` candidate; None where the view has none (a plain table, a task without them)."""
    index = [i for i, n in enumerate(view_names) if n.startswith("cost:")]
    return (np.array(index), [view_names[i][len("cost:"):] for i in index]) if index else None


def scratch_columns(space: Space | None, view_names: list[str]) -> np.ndarray:
    """The columns the ``scratch`` candidate fits: the additive terms of subnets, or every column of a plain table."""
    if space is None:
        return np.arange(len(view_names))
    return np.array([i for i, n in enumerate(view_names) if n.startswith("sum:")])

"""Layer-composed model: latency = constant + the model's own terms + the sum along the subnet of per-layer costs,
with a small learned residual for the whole model on top.

Its columns (``latency.features.layered_terms``, the vision task's ``layered_terms``) are physical counts summed over
the subnet's layers: ``model:*`` (embedding, head, patch embedding) and ``layer:*`` (the projections' and the MLP's
FLOPs, the norms' elements) cost alike in every layer, one cost each; ``type[KIND]:TERM`` cost per attention type (a
per-layer overhead, the q/k/v elements, the token mixing as the type's own cost model counts it: ``~T^2 * A`` for a
quadratic type, ``~T * w * A`` for a window ``w``).  The fit:

1. **Non-negative least squares on the relative error** (as :mod:`.additive`), where each type's cost of a term is
   pulled toward one common cost of that term by a ridge of strength ``lam`` (one per term): from few timings a type
   seen in two subnets gets about the common cost per FLOP, from many its own; a type never timed gets the common
   cost.  The strengths are chosen by cross-validation inside the fit (leave-one-out on small tables: one common
   strength, then a term's own where it helps), so 20 timed subnets are enough.
2. **A ridge residual for the whole model**: the log of what the sum leaves, out-of-fold, regressed (scikit-learn's
   ``RidgeCV``, its strength by leave-one-out) on the standardised log-counts of the whole model (each column of one
   cost, each term's total over the types); kept only when it beats no residual out-of-sample, and bounded to the
   residuals it saw (it can bend the sum, never run away from it).

Without column names (a plain table, or a caller that gives none) every column has its own cost and nothing is
pulled: the additive model with the residual.
"""

from __future__ import annotations

import re

import numpy as np
from scipy.optimize import nnls

from .base import register_predictor

TYPED = re.compile(r"^(?:cost:)?type\[(.+)\]:(\w+)$")  # a per-type column: type[KIND]:TERM
LAMS = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)  # strengths of the pull toward each term's common cost
GAIN = 0.02  # a term's own strength replaces the common one only if it cuts the cross-validated error by this share
PASSES = 2  # passes over the terms choosing their own strengths
ALPHAS = tuple(np.logspace(-1, 4, 11))  # the residual ridge's strengths (RidgeCV's leave-one-out picks)


def column_groups(names: list[str] | None, d: int) -> np.ndarray:
    """Per column: the index of its term group (``type[K]:TERM`` columns of one TERM share one), -1 for a column of
    its own cost."""
    groups, found = np.full(d, -1), {}
    for j, name in enumerate(names or []):
        m = TYPED.match(name)
        if m:
            groups[j] = found.setdefault(m.group(2), len(found))
    return groups


def pulled_nnls(a: np.ndarray, groups: np.ndarray, lam) -> np.ndarray:
    """Non-negative ``u`` (d,) minimising ``sum_i (a_i . u - 1)^2 + sum_j lam_g(j) * (u_j - m_g(j))^2`` over ``u`` and
    the groups' common costs ``m`` (non-negative too); columns of group -1 are not pulled; ``lam``: one strength, or
    one per group.  ``a`` (n, d) holds rows already divided by their latency and columns already scaled so that a cost
    of 1 is the whole of a typical latency."""
    n, d = a.shape
    g = int(groups.max()) + 1
    pulled = np.flatnonzero(groups >= 0)
    strength = np.sqrt(np.broadcast_to(np.asarray(lam, dtype=np.float64), (max(g, 1),))[groups[pulled]])
    pull = np.zeros((len(pulled), d + g))
    pull[np.arange(len(pulled)), pulled] = strength
    pull[np.arange(len(pulled)), d + groups[pulled]] = -strength
    design = np.vstack([np.hstack([a, np.zeros((n, g))]), pull])
    sol, _ = nnls(design, np.concatenate([np.ones(n), np.zeros(len(pulled))]), maxiter=50 * (d + g))
    return sol[:d]


def column_scales(x1: np.ndarray, y: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each column's typical share of a latency (mean of x / y; a group's: of the group's row sums, so the costs it
    pulls together are on one scale); 1 where a column is never used."""
    rel = x1 / y[:, None]
    scale = rel.mean(axis=0)
    for gi in range(int(groups.max()) + 1):
        scale[groups == gi] = rel[:, groups == gi].sum(axis=1).mean()
    return np.where(scale > 0, scale, 1.0)


@register_predictor
class Layered:
    kind = "layered"
    reads_names = True  # constructed with its view's column names (``models.new_model``): they say the type groups

    def __init__(self, names: list[str] | None = None):
        self.names = names
        self.coef: np.ndarray | None = None  # (1 + d,) ms per unit, the constant first
        self.lam: list[float] = []  # the pull's strength per term group (in the order of column_groups)
        self.alpha = 0.0
        self.res: dict[str, np.ndarray] = {}

    @staticmethod
    def _with_const(x: np.ndarray) -> np.ndarray:
        return np.hstack([np.ones((len(x), 1)), x])

    def _solve(self, x1: np.ndarray, y: np.ndarray, groups: np.ndarray, lam) -> np.ndarray:
        scale = column_scales(x1, y, groups)
        return pulled_nnls(x1 / y[:, None] / scale, groups, lam) / scale

    def _folds(self, n: int, seed: int) -> list[np.ndarray]:
        if n <= 40:
            return [np.array([i]) for i in range(n)]
        order = np.random.default_rng([seed, 7]).permutation(n)
        return [order[f::5] for f in range(5)]

    def _out_of_fold(self, x1: np.ndarray, y: np.ndarray, groups: np.ndarray, lam, folds) -> np.ndarray:
        oof = np.empty_like(y)
        for test in folds:
            train = np.setdiff1d(np.arange(len(y)), test)
            oof[test] = x1[test] @ self._solve(x1[train], y[train], groups, lam)
        return np.maximum(oof, 1e-9)

    def strengths(self, x1: np.ndarray, y: np.ndarray, groups: np.ndarray, folds) -> np.ndarray:
        """The pull's strength per term group, by cross-validated mean relative error: the best common one, then, term
        by term (``PASSES`` passes), a strength of its own where it cuts the error by ``GAIN`` (a term that varies little
        between types, or matters little, is pooled; one that differs is let go)."""
        n_groups = max(int(groups.max()) + 1, 1)

        def error(lam) -> float:
            return float(np.mean(np.abs(self._out_of_fold(x1, y, groups, lam, folds) - y) / y))

        errors = {lam: error(np.full(n_groups, lam)) for lam in LAMS}
        common = min(errors, key=lambda k: errors[k])  # (the first of equals: the weakest pull)
        lam, best = np.full(n_groups, common), errors[common]
        for _ in range(PASSES if groups.max() >= 1 else 0):
            for g in range(n_groups):
                for trial in LAMS:
                    if trial == lam[g]:
                        continue
                    candidate = lam.copy()
                    candidate[g] = trial
                    e = error(candidate)
                    if e < best * (1 - GAIN):
                        lam, best = candidate, e
        return lam

    def fit(self, x: np.ndarray, y: np.ndarray, seed: int = 0) -> "Layered":
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        x1 = self._with_const(x)
        groups = np.concatenate([[-1], column_groups(self.names, x.shape[1])])
        folds = self._folds(len(y), seed)
        lam = self.strengths(x1, y, groups, folds)
        self.lam = lam.tolist()
        self.coef = self._solve(x1, y, groups, lam)
        oof = self._out_of_fold(x1, y, groups, lam, folds)
        self._fit_residual(x, np.log(y) - np.log(oof))
        return self

    def whole_model(self, x: np.ndarray) -> np.ndarray:
        """The residual's view of a subnet: its columns of one cost each, then each term's total over the types (the
        whole model's counts: a per-type column alone says too little of the whole to bend it)."""
        groups = column_groups(self.names, x.shape[1])
        return np.hstack([x[:, groups == -1], *(x[:, groups == g].sum(axis=1, keepdims=True) for g in range(groups.max() + 1))])

    def _residual_input(self, x: np.ndarray) -> np.ndarray:
        r = self.res
        z = np.log1p(np.maximum(self.whole_model(x)[:, r["used"]], 0.0) / r["unit"])
        return (z - r["center"]) / r["spread"]

    def _fit_residual(self, x: np.ndarray, r: np.ndarray) -> None:
        """Ridge of the out-of-fold log residual ``r`` on the standardised log-counts of the whole model; kept if its
        leave-one-out error beats predicting no residual."""
        from sklearn.linear_model import RidgeCV

        whole = self.whole_model(x)
        used = np.flatnonzero(np.ptp(whole, axis=0) > 0)
        unit = np.abs(whole[:, used]).mean(axis=0)
        self.res = {"used": used, "unit": np.where(unit > 0, unit, 1.0), "center": np.zeros(len(used)),
                    "spread": np.ones(len(used)), "coef": np.zeros(len(used)), "intercept": np.zeros(1),
                    "bounds": np.array([float(r.min()), float(r.max())])}
        self.alpha = 0.0
        if len(used) == 0 or len(r) < 5:
            return
        z = np.log1p(whole[:, used] / self.res["unit"])
        self.res["center"], spread = z.mean(axis=0), z.std(axis=0)
        self.res["spread"] = np.where(spread > 0, spread, 1.0)
        ridge = RidgeCV(alphas=ALPHAS).fit(self._residual_input(x), r)  # leave-one-out (GCV): best_score_ is -its MSE
        if -ridge.best_score_ < float(np.mean(r**2)):  # the residual predicts the left-out subnet better than none
            self.alpha = float(ridge.alpha_)
            self.res["coef"], self.res["intercept"] = ridge.coef_.astype(np.float64), np.array([float(ridge.intercept_)])

    def predict(self, x: np.ndarray) -> np.ndarray:
        assert self.coef is not None, "fit or load first"
        x = np.asarray(x, dtype=np.float64)
        base = np.maximum(self._with_const(x) @ self.coef, 1e-9)
        if self.alpha == 0:
            return base
        r = self.res
        return base * np.exp(np.clip(self._residual_input(x) @ r["coef"] + r["intercept"][0], *r["bounds"]))

    def costs(self) -> dict[str, float]:
        """Milliseconds per unit of each term of the sum (the residual aside)."""
        names = ["const"] + (self.names or [f"x{i}" for i in range(len(self.coef) - 1)])
        return dict(zip(names, self.coef.tolist()))

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        meta = {"names": self.names, "lam": self.lam, "alpha": self.alpha}
        return meta, {"coef": self.coef, **{f"res.{k}": v for k, v in self.res.items()}}

    @classmethod
    def from_state(cls, meta: dict, arrays: dict[str, np.ndarray]) -> "Layered":
        model = cls(meta.get("names"))
        model.lam, model.alpha = list(meta["lam"]), meta["alpha"]
        model.coef = arrays["coef"]
        model.res = {k[len("res."):]: v for k, v in arrays.items() if k.startswith("res.")}
        model.res["used"] = model.res["used"].astype(np.int64)
        return model

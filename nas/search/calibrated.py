"""A ranker calibrated on retrained models: predicted retrained validation loss from a subnet's shape and its
inherited loss.

Inherited (weight-shared) loss ranks subnets of one attention type well and misjudges whole types: its error is
mostly an offset per type (a type the supernet trains less, or that shares projections it uses differently,
looks worse than it retrains).  A few retrained models measure those offsets.  :func:`fit_ranker` fits the
retrained models' *validation* loss (the search's fitness windows; never a test split) from

* ``inherited``: the subnet's inherited loss on the same windows;
* ``frac:<type>``: the share of its layers of each attention type of the space;
* mixing: ``has:<type>`` (whether any layer uses the type: one local layer among global ones gives most of the local
  type's gain, which a share alone cannot say), ``first:<type>`` and ``last:<type>`` (which type sits at the bottom
  and at the top of the stack) and ``types`` (how many types the subnet mixes);
* its size: ``depth``, ``embed_dim``, ``log_params`` (and, in the widest model, mean heads and FFN width);
* the types' quality: each type's retrained loss at the fit set's mean size, from a first ridge fit on the uniform
  models among the fitted ones (:func:`type_quality`, stored in the ranker), gives ``best_quality`` (the best type
  present) and ``mean_quality`` (the layers' mean); leave-one-out refits it without the model left out;

with ridge regression on standardised features (scikit-learn's ``RidgeCV``, its penalty by efficient leave-one-out),
one of several feature sets chosen by leave-one-out mean absolute error over the models given.  When the models mix
uniform subnets (one type in every layer) and mixed ones, the error that chooses is the mean of the two groups'
errors, so that a few mixed models count as much as many uniform ones (a ranker fitted on uniform models only
over-predicted every mixed subnet's loss); the report gives each group's error and rank correlation.  Everything
is linear, so the ranker is a JSON file of coefficients: loading it runs no code.

:class:`CalibratedFitness` wraps the search's :class:`~supernet.scoring.InheritedLoss` and answers the ranker's
prediction instead; the ranker refuses windows or a supernet other than the ones it was fitted on.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from search_spaces import Space, Subnet, UserError

FORMAT = "nas-accuracy-ranker"
VERSION = 1
ALPHAS = tuple(float(a) for a in np.logspace(-3, 3, 25))

# feature sets (names of the columns :func:`features` makes; "frac:*" = one per attention type)
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "inherited": ("inherited",),  # a linear map of the inherited loss: its ranking, unchanged
    "offset": ("inherited", "frac:*"),  # inherited loss + a per-type offset
    "size": ("inherited", "frac:*", "depth", "embed_dim", "log_params"),
    "full": ("inherited", "frac:*", "depth", "embed_dim", "log_params", "heads", "ffn_dim"),
    "shape": ("frac:*", "depth", "embed_dim", "log_params"),  # no inherited loss: types and size alone
    "mix": ("inherited", "frac:*", "has:*", "types", "depth", "embed_dim", "log_params"),  # + which types are present
    "mix-depth": ("inherited", "frac:*", "has:*", "first:*", "last:*", "types", "depth", "embed_dim", "log_params"),
    "mix-shape": ("frac:*", "has:*", "first:*", "last:*", "types", "depth", "embed_dim", "log_params"),
    "quality": ("inherited", "best_quality", "mean_quality", "types", "depth", "embed_dim", "log_params"),
    "quality-mix": ("inherited", "best_quality", "mean_quality", "has:*", "types", "depth", "embed_dim", "log_params"),
}
QUALITY = ("best_quality", "mean_quality")  # the columns that need the types' quality (type_quality)
PER_TYPE = ("frac", "has", "first", "last")  # the columns with one per attention type of the space ("frac:*")


def feature_names(space: Space, kind: str) -> list[str]:
    out = []
    for name in FEATURE_SETS[kind]:
        prefix = name[:-2]
        out += [f"{prefix}:{a}" for a in space.attention] if name.endswith(":*") and prefix in PER_TYPE else [name]
    return out


def is_mixed(subnet: Subnet) -> bool:
    """Whether the subnet's self-attention layers use more than one attention type."""
    return len({a for s in subnet.stacks for a in s.attention}) > 1


def features(space: Space, subnet: Subnet, inherited: float, params: int,
             quality: dict[str, float] | None = None) -> dict[str, float]:
    """Every column any feature set reads, for one subnet: over all its self-attention layers (an encoder-decoder's
    two stacks together): ``depth`` the layers, ``embed_dim`` their mean width, ``heads`` and ``ffn_dim`` their means,
    ``frac:<type>`` the share of each type, ``has:<type>`` whether it is there at all, ``first:<type>`` / ``last:<type>``
    whether it is the first / last layer's (of each stack, averaged over the stacks), ``types`` how many there are."""
    stacks = subnet.stacks
    d = sum(s.depth for s in stacks)
    attention = [a for s in stacks for a in s.attention]
    row = {"inherited": float(inherited), "depth": float(d), "embed_dim": sum(s.embed_dim * s.depth for s in stacks) / d,
           "log_params": math.log(params), "heads": float(np.mean([h for s in stacks for h in s.heads])),
           "ffn_dim": float(np.mean([f for s in stacks for f in s.ffn_dim])), "types": float(len(set(attention)))}
    for a in space.attention:
        row[f"frac:{a}"] = attention.count(a) / d
        row[f"has:{a}"] = float(a in attention)
        row[f"first:{a}"] = sum(s.attention[0] == a for s in stacks) / len(stacks)
        row[f"last:{a}"] = sum(s.attention[-1] == a for s in stacks) / len(stacks)
    if quality:
        row["best_quality"] = min(quality[a] for a in attention)
        row["mean_quality"] = float(np.mean([quality[a] for a in attention]))
    return row


def type_quality(space: Space, models: Sequence["Retrained"]) -> dict[str, float]:
    """Each attention type's retrained loss at the mean size of the uniform models among ``models`` (a ridge fit of
    their loss on the ``shape`` columns, read at one type's share 1); a type with no uniform model gets the mean of
    the others.  Empty when fewer than 4 uniform models are given."""
    uniform = [m for m in models if not is_mixed(m.subnet)]
    if len(uniform) < 4:
        return {}
    names = feature_names(space, "shape")
    lin = fit_linear([features(space, m.subnet, m.inherited, m.params) for m in uniform],
                     np.array([m.retrained for m in uniform], dtype=np.float64), names)
    at_mean = dict(zip(names, lin.mean))
    present = {a for m in uniform for s in m.subnet.stacks for a in s.attention}
    quality = {a: float(lin.predict([{**at_mean, **{f"frac:{b}": float(b == a) for b in space.attention}}])[0])
               for a in space.attention if a in present}
    fill = float(np.mean(list(quality.values())))
    return {a: quality.get(a, fill) for a in space.attention}


@dataclass
class Linear:
    """y = intercept + ((x - mean) / scale) . coef over the named columns."""

    names: list[str]
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    alpha: float

    def predict(self, rows: Sequence[dict[str, float]]) -> np.ndarray:
        x = np.array([[r[n] for n in self.names] for r in rows], dtype=np.float64).reshape(len(rows), len(self.names))
        return self.intercept + ((x - self.mean) / self.scale) @ self.coef

    def to_dict(self) -> dict[str, Any]:
        return {"names": self.names, "mean": self.mean.tolist(), "scale": self.scale.tolist(), "coef": self.coef.tolist(),
                "intercept": self.intercept, "alpha": self.alpha}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Linear":
        n = len(d["names"])
        arrays = [np.asarray(d[k], dtype=np.float64) for k in ("mean", "scale", "coef")]
        if any(a.shape != (n,) for a in arrays) or not all(np.isfinite(a).all() for a in arrays):
            raise ValueError("mean, scale and coef must be finite lists as long as names")
        return cls(list(map(str, d["names"])), *arrays, float(d["intercept"]), float(d["alpha"]))


def fit_linear(rows: Sequence[dict[str, float]], y: np.ndarray, names: list[str]) -> Linear:
    """Ridge regression on standardised columns, the penalty chosen by RidgeCV's efficient leave-one-out."""
    from sklearn.linear_model import RidgeCV

    x = np.array([[r[n] for n in names] for r in rows], dtype=np.float64)
    mean, scale = x.mean(0), x.std(0)
    scale[scale == 0] = 1.0  # a constant column (a type no model uses) gets weight 0 under the penalty
    model = RidgeCV(alphas=ALPHAS).fit((x - mean) / scale, y)
    return Linear(names, mean, scale, np.asarray(model.coef_, dtype=np.float64), float(model.intercept_), float(model.alpha_))


def leave_one_out(rows: Sequence[dict[str, float]], y: np.ndarray, names: list[str], refeature=None) -> np.ndarray:
    """Each model's prediction by the ranker fitted on all the others (the penalty chosen again each time).
    ``refeature(keep) -> rows`` rebuilds every model's features from the kept ones alone (the types' quality)."""
    out = np.empty(len(rows))
    for i in range(len(rows)):
        keep = [j for j in range(len(rows)) if j != i]
        fold = refeature(keep) if refeature is not None else rows
        out[i] = fit_linear([fold[j] for j in keep], y[keep], names).predict([fold[i]])[0]
    return out


def kendall(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import kendalltau

    return float(kendalltau(a, b).statistic) if len(a) > 2 else float("nan")


@dataclass
class Ranker:
    """A fitted ranker: the chosen model, what it was fitted on and its leave-one-out report."""

    kind: str
    model: Linear
    space_hash: str
    fitness: dict[str, Any]  # the inherited loss's windows (InheritedLoss.description + the data digest)
    supernet: str  # digest of the supernet checkpoint whose inherited loss is a feature
    report: dict[str, Any] = field(default_factory=dict)
    models: list[dict[str, Any]] = field(default_factory=list)
    quality: dict[str, float] = field(default_factory=dict)  # type_quality of the fitted models (the quality columns)

    def predict(self, space: Space, subnets: Sequence[Subnet], inherited: Sequence[float], params: Sequence[int]) -> np.ndarray:
        return self.model.predict([features(space, s, i, p, self.quality) for s, i, p in zip(subnets, inherited, params)])

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "kind": self.kind, "model": self.model.to_dict(),
                "space_hash": self.space_hash, "fitness": self.fitness, "supernet": self.supernet, "report": self.report,
                "models": self.models, "quality": self.quality}

    def save(self, out: Path) -> Path:
        from supernet.files import atomic_write

        out.mkdir(parents=True, exist_ok=True)
        return atomic_write(out / "ranker.json", json.dumps(self.to_dict(), indent=1) + "\n")

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def load_ranker(path: str | Path) -> Ranker:
    """``DIR/ranker.json`` (or the file itself), checked; one line naming the file and the problem otherwise."""
    path = Path(path)
    file = path / "ranker.json" if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"{path}: no ranker.json here (write one with `nas fit-accuracy`)")
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{file}: not a ranker file (not JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UserError(f"{file}: not a ranker of this tool (no '{FORMAT}' format marker)")
    if doc.get("version") != VERSION:
        raise UserError(f"{file}: ranker version {doc.get('version')!r}, this tool reads version {VERSION}")
    try:
        model = Linear.from_dict(doc["model"])
        kind = str(doc["kind"])
        quality = {str(k): float(v) for k, v in dict(doc.get("quality", {})).items()}
        if not all(math.isfinite(v) for v in quality.values()):
            raise ValueError("quality: not finite")
        if set(model.names) & set(QUALITY) and not quality:
            raise ValueError(f"the model reads {', '.join(QUALITY)} but the file has no quality")
        return Ranker(kind, model, str(doc["space_hash"]), dict(doc["fitness"]), str(doc["supernet"]),
                      dict(doc.get("report", {})), list(doc.get("models", [])), quality)
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{file}: a damaged ranker ({type(e).__name__}: {e})") from None


@dataclass(frozen=True)
class Retrained:
    """One retrained model: its subnet, its parameters and its validation loss with retrained and inherited weights."""

    name: str
    subnet: Subnet
    params: int
    inherited: float
    retrained: float


def fit_ranker(space: Space, models: Sequence[Retrained], fitness: dict[str, Any], supernet: str,
               kinds: Sequence[str] = tuple(FEATURE_SETS)) -> Ranker:
    """Fit every feature set of ``kinds``; keep the one of the lowest leave-one-out mean absolute error."""
    if len(models) < 4:
        raise UserError(f"{len(models)} retrained models: a calibrated ranker needs at least 4 (better 10 or more, "
                        "covering each attention type)")
    quality = type_quality(space, models)
    if sum(not is_mixed(m.subnet) for m in models) < 5:  # leave-one-out needs the quality of 4 uniform models a fold
        quality = {}
        kinds = [k for k in kinds if not set(feature_names(space, k)) & set(QUALITY)]

    def rows_from(keep: Sequence[int]) -> list[dict[str, float]]:
        q = type_quality(space, [models[j] for j in keep])
        return [features(space, m.subnet, m.inherited, m.params, q) for m in models]

    rows = [features(space, m.subnet, m.inherited, m.params, quality) for m in models]
    y = np.array([m.retrained for m in models], dtype=np.float64)
    inherited = np.array([m.inherited for m in models])
    mixed = np.array([is_mixed(m.subnet) for m in models])
    groups = {g: mask for g, mask in (("uniform", ~mixed), ("mixed", mixed)) if mask.any()}
    report: dict[str, Any] = {"n": len(models), "inherited_tau": kendall(inherited, y), "candidates": {},
                              "groups": {g: int(mask.sum()) for g, mask in groups.items()},
                              "criterion": "mean of the groups' leave-one-out MAE" if len(groups) > 1 else "leave-one-out MAE"}
    best = None
    for kind in kinds:
        names = feature_names(space, kind)
        loo = leave_one_out(rows, y, names, rows_from if set(names) & set(QUALITY) else None)
        err = np.abs(loo - y)
        by_group = {g: {"loo_mae": float(err[mask].mean()), "loo_tau": kendall(loo[mask], y[mask]), "n": int(mask.sum())}
                    for g, mask in groups.items()}
        score = float(np.mean([v["loo_mae"] for v in by_group.values()]))
        report["candidates"][kind] = {"loo_mae": float(err.mean()), "loo_max": float(err.max()), "loo_tau": kendall(loo, y),
                                      "score": score, "groups": by_group, "loo": loo.tolist()}
        if best is None or score < report["candidates"][best]["score"]:
            best = kind
    report["chosen"] = best
    model = fit_linear(rows, y, feature_names(space, best))
    used = [{"name": m.name, "subnet": m.subnet.to_dict(), "params": m.params, "inherited": m.inherited,
             "retrained": m.retrained} for m in models]
    return Ranker(best, model, space.hash, fitness, supernet, report, used, quality)


def report_text(ranker: Ranker) -> str:
    r = ranker.report
    groups = list(r.get("groups", {}))
    split = len(groups) > 1
    head = f"{'feature set':12} {'LOO MAE':>9} {'LOO max':>9} {'LOO tau':>8}"
    if split:
        head += "".join(f" {g + ' MAE':>12} {g + ' tau':>12}" for g in groups)
    lines = [head]
    for kind, c in r["candidates"].items():
        mark = "  <- chosen" if kind == r["chosen"] else ""
        line = f"{kind:12} {c['loo_mae']:>9.4f} {c['loo_max']:>9.4f} {c['loo_tau']:>8.3f}"
        if split:
            line += "".join(f" {c['groups'][g]['loo_mae']:>12.4f} {c['groups'][g]['loo_tau']:>12.3f}" for g in groups)
        lines.append(line + mark)
    counts = ", ".join(f"{n} {g}" for g, n in r.get("groups", {}).items())
    lines.append(f"{r['n']} retrained models ({counts}); chosen by the {r.get('criterion', 'leave-one-out MAE')}; "
                 f"Kendall tau of their inherited loss alone: {r['inherited_tau']:.3f}")
    return "\n".join(lines)


class CalibratedFitness:
    """The search's fitness through a :class:`Ranker`: predicted retrained validation loss (bits) of each subnet.

    ``inherited`` is the search's :class:`~supernet.scoring.InheritedLoss` on the windows the ranker was fitted on
    (checked here); ``params`` gives a subnet's exact parameter count."""

    def __init__(self, inherited, ranker: Ranker, space: Space, params, fitness_id: dict[str, Any], supernet: str, where: str):
        problems = []
        if ranker.space_hash != space.hash:
            problems.append(f"fitted on space hash {ranker.space_hash}, the supernet's space is {space.hash}")
        if ranker.supernet != supernet:
            problems.append(f"fitted on the inherited loss of supernet {ranker.supernet}, this one is {supernet}")
        if ranker.fitness != fitness_id:
            diff = sorted(k for k in set(ranker.fitness) | set(fitness_id) if ranker.fitness.get(k) != fitness_id.get(k))
            problems.append("fitted on other fitness windows (" + ", ".join(
                f"{k}: {ranker.fitness.get(k)!r} there, {fitness_id.get(k)!r} here" for k in diff) + ")")
        if problems:
            raise UserError(f"--fitness calibrated:{where}: " + "; ".join(problems)
                            + " (fit the ranker with the search's --val-windows, --seq-len, --val-seed and supernet)")
        self.inherited, self.ranker, self.space, self.params = inherited, ranker, space, params
        if hasattr(inherited, "heldout"):  # per-window scores: the search's separability report reads them
            self.heldout, self.batch_size = inherited.heldout, inherited.batch_size
        if hasattr(inherited, "held"):  # each subnet's vocabulary's windows (a space that searches it)
            self.held, self.model = inherited.held, inherited.model
        self.description = {**inherited.description, "ranker": ranker.digest, "ranker_kind": ranker.kind}
        self.summary = ""

    def scorer(self, subnet: Subnet):
        return self.inherited.scorer(subnet)

    def static(self, model) -> float:
        """A trained model's score on the same held-out data (what the ranker was fitted to predict)."""
        return self.inherited.static(model)

    def __call__(self, subnets: Sequence[Subnet]) -> np.ndarray:
        inherited = self.inherited(subnets)
        return self.ranker.predict(self.space, subnets, inherited, [self.params(s) for s in subnets])


def best_uniform_per_type(space: Space, feasible, params) -> list[Subnet]:
    """Per attention type of the space, its largest (by parameters) uniform subnet that ``feasible`` accepts:
    the hand-scaled model of each type, which opens the search's first generation."""
    uniform = [s for s in space.uniform() if s in space]
    ok = feasible(uniform) if uniform else np.zeros(0, dtype=bool)
    best: dict[str, Subnet] = {}
    for s, good in zip(uniform, ok):
        if good and (s.attention[0] not in best or (params(s), s.key) > (params(best[s.attention[0]]), best[s.attention[0]].key)):
            best[s.attention[0]] = s
    return [best[a] for a in space.attention if a in best]

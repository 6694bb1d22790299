"""A fitted predictor on disk: ``predictor.json`` (everything readable) + ``arrays.npz`` (weights).

Loading reads JSON and an npz with ``allow_pickle=False``: nothing in the files can run code.
A predictor of subnets carries its space (and hash), workload and device fingerprint, and
computes its own features; one fitted on a plain CSV carries its column names instead.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml

from search_spaces import Space, Subnet, UserError, Workload, parse_space
from search_spaces.errors import first_line, shown
from supernet.files import atomic_write, check_parts, checksums, remove_stale

from .base import Regressor
from .models import MODELS, subnet_matrix

FORMAT = "nas-latency-predictor"
VERSION = 1
__all__ = ["FORMAT", "MODELS", "VERSION", "Predictor", "load_predictor", "subnet_matrix"]  # (MODELS, subnet_matrix: .models)


# --------------------------------------------------------------------------- features of subnets


# --------------------------------------------------------------------------- the predictor


@dataclass
class Predictor:
    name: str  # the model kind: "mlp", "gbt", "additive", "layered" or "transfer" (few-shot, from other devices' predictors)
    regressor: Regressor
    space: Space | None  # None: fitted on a plain feature table
    workload_spec: Workload | None
    fingerprint: dict
    columns: list[str] | None = None  # plain tables: the feature columns, in order
    metrics: dict = field(default_factory=dict)
    # The campaign's drift baseline: the reference model's time that every timing was scaled to.  A later
    # measurement anchored to it (``measure(..., baseline_ms=reference_ms)``) is comparable with the predictions.
    reference_ms: float | None = None

    @property
    def space_hash(self) -> str | None:
        return self.space.hash if self.space is not None else None

    @property
    def precision(self) -> str:
        """The precision of the timings it was fitted on (``fp32`` for tables measured before precisions existed)."""
        from ..quantize import precision_of

        return precision_of(self.fingerprint)

    @property
    def workload(self) -> str | None:
        return self.workload_spec.name if self.workload_spec is not None else None

    def check_space(self, space: Space) -> None:
        """Refuse a space whose subnets differ from the predictor's (the latency workloads listed may differ)."""
        if self.space is None:
            raise UserError("this predictor was fitted on a plain feature table, not on subnets of a space")
        if space.arch_hash != self.space.arch_hash:
            raise UserError(
                f"predictor was fitted on space {self.space.name!r} (hash {self.space.hash}); "
                f"space {space.name!r} ({space.source}) has hash {space.hash}: refit the predictor on timings of this space"
            )

    def check_workload(self, workload: Workload, where: str = "--workload") -> None:
        """Refuse a workload other than the one this predictor was fitted at (name, kind and shape)."""
        mine = self.workload_spec
        if mine is None:
            raise UserError(f"{where}: this predictor was fitted on a plain feature table; it knows no workload")
        if mine != workload:
            raise UserError(
                f"{where}: asks for workload {workload}, but this predictor was fitted on timings of workload {mine}; "
                f"measure that workload (nas measure-latency --workload {workload.name}) and fit a predictor on it"
            )

    def predict(self, subnets: Sequence[Subnet]) -> np.ndarray:
        """Predicted milliseconds of each subnet at the predictor's workload."""
        if self.space is None:
            raise UserError("this predictor was fitted on a plain feature table; use predict_features")
        for s in subnets:
            self.space.check(s)
        if not subnets:
            return np.zeros(0)
        x, _ = subnet_matrix(self.name, self.space, self.workload_spec, subnets)
        return self.regressor.predict(x)

    def predict_features(self, x: np.ndarray) -> np.ndarray:
        return self.regressor.predict(np.asarray(x, dtype=np.float64))

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        meta, arrays = self.regressor.state()
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "model": self.name,
            "model_state": meta,
            "space": self.space.to_dict() if self.space is not None else None,
            "space_hash": self.space_hash,
            "workload": None if self.workload_spec is None else self.workload_spec.record(),
            "fingerprint": self.fingerprint,
            "columns": self.columns,
            "metrics": self.metrics,
            "reference_ms": self.reference_ms,
        }
        # the manifest (predictor.json, with the checksum of arrays.npz) goes last; an older one is removed first
        remove_stale(directory, ("predictor.json",))
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        atomic_write(directory / "arrays.npz", buf.getvalue())
        doc["files"] = checksums(directory, ["arrays.npz"])
        atomic_write(directory / "predictor.json", json.dumps(doc, indent=2, sort_keys=True, default=float) + "\n")
        return directory / "predictor.json"


# The JSON settings of each model kind's state (``Regressor.state()``'s first half), by type: checked before the
# arrays are read into a model, so that a predictor.json whose fields have the wrong types is blamed, not arrays.npz.
_INT, _NUM, _STR = ("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool)), \
    ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)), ("a string", lambda v: isinstance(v, str))
_NAMES = ("null or a list of strings", lambda v: v is None or (isinstance(v, list) and all(isinstance(n, str) for n in v)))
STATE_FIELDS = {
    "mlp": {"hidden": _INT, "layers": _INT, "max_iter": _INT, "alpha": _NUM, "y_mean": _NUM, "y_scale": _NUM},
    "gbt": {"n_estimators": _INT, "learning_rate": _NUM, "max_depth": _INT, "subsample": _NUM, "init": _NUM},
    "additive": {"names": _NAMES},
    "layered": {"names": _NAMES, "lam": ("a list of numbers", lambda v: isinstance(v, list) and all(_NUM[1](n) for n in v)),
                "alpha": _NUM},
}
# The top-level fields of predictor.json besides format, version, model and files: their types.
DOC_FIELDS = {
    "model_state": ("a mapping", lambda v: isinstance(v, dict)),
    "columns": _NAMES,
    "fingerprint": ("null or a mapping", lambda v: v is None or isinstance(v, dict)),
    "metrics": ("null or a mapping", lambda v: v is None or isinstance(v, dict)),
    "reference_ms": ("null or a number", lambda v: v is None or _NUM[1](v)),
    "workload": ("null or a mapping", lambda v: v is None or isinstance(v, dict)),
    "space": ("null or a mapping", lambda v: v is None or isinstance(v, dict)),
}


def state_problems(kind: str, state: object, where: str) -> list[str]:
    """What is wrong with the JSON state of a ``kind`` model (a transfer's: its head and each source's, recursively)."""
    if not isinstance(state, dict):
        return [f"{where}: {shown(state)} is not a mapping"]
    if kind == "transfer":
        problems = [f"{where}.{k}: {shown(state.get(k))} is not a string" for k in ("method", "label")
                    if not isinstance(state.get(k), str)]
        problems += state_problems("additive", state.get("head"), f"{where}.head")
        sources = state.get("sources")
        if not isinstance(sources, list):
            return problems + [f"{where}.sources: {shown(sources)} is not a list"]
        for i, source in enumerate(sources):
            at = f"{where}.sources[{i}]"
            if not isinstance(source, dict) or not isinstance(source.get("label"), str) \
                    or source.get("kind") not in (*STATE_FIELDS, "transfer"):
                problems.append(f"{at}: {shown(source)} is not a source (label, kind: one of {', '.join(STATE_FIELDS)}, state)")
                continue
            problems += state_problems(source["kind"], source.get("state"), f"{at}.state")
        return problems
    problems = []
    for name, (what, ok) in STATE_FIELDS[kind].items():
        if name not in state and name == "names":
            continue  # (an additive model fitted on plain columns may carry none)
        if name not in state or not ok(state[name]):
            problems.append(f"{where}.{name}: {shown(state.get(name)) if name in state else 'missing'}; expected {what}")
    return problems


def load_predictor(path: str | Path) -> Predictor:
    """Read a predictor saved by :meth:`Predictor.save` (its folder or its ``predictor.json``)."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    doc_path, arr_path = folder / "predictor.json", folder / "arrays.npz"
    for p in (doc_path, arr_path):
        if not p.exists():
            raise UserError(
                f"{path}: not a predictor ({p.name} missing; `nas fit-predictor --out DIR` writes predictor.json and arrays.npz)"
            )
    try:
        doc = json.loads(doc_path.read_text())
    except (json.JSONDecodeError, ValueError, OSError) as e:
        raise UserError(f"{doc_path}: unreadable predictor file: {e}") from None
    if isinstance(doc, dict) and isinstance(doc.get("files"), dict):  # written before checksums were kept: no check
        check_parts(folder, doc["files"], doc_path)
    try:
        with np.load(arr_path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:  # noqa: BLE001 - a truncated zip, a member that is not an array, a pickle refused
        raise UserError(f"{arr_path}: not a readable array file ({type(e).__name__}: {first_line(e)})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UserError(f"{doc_path}: not a latency predictor of this tool (no {FORMAT!r} format marker)")
    if doc.get("version") != VERSION:
        raise UserError(f"{doc_path}: predictor version {doc.get('version')!r}, this tool reads version {VERSION}")
    from .transfer import Transfer  # here, not at the top: transfer.py builds on this module

    loaders = {**MODELS, Transfer.kind: Transfer}
    if doc.get("model") not in loaders:
        raise UserError(f"{doc_path}: model {shown(doc.get('model'))} is not one of {', '.join(loaders)}")
    problems = [f"{name}: {shown(doc[name])}; expected {what}" for name, (what, ok) in DOC_FIELDS.items()
                if name in doc and not ok(doc[name])]
    problems += [] if problems else state_problems(doc["model"], doc.get("model_state"), "model_state")
    if problems:  # the JSON is at fault (edited, or of another tool), whatever arrays.npz holds
        raise UserError(f"{doc_path}: not the predictor file this tool writes: {'; '.join(problems[:3])}")
    space = None
    if doc.get("space") is not None:
        space = parse_space(yaml.safe_dump(doc["space"]), where=f"{doc_path.name}[space]", source=str(doc_path))
        if space.hash != doc.get("space_hash"):
            raise UserError(f"{doc_path}: stored space hash {doc.get('space_hash')} does not match its space ({space.hash})")
    workload = Workload.from_record(doc["workload"], f"{doc_path}: workload") if doc.get("workload") else None
    try:
        regressor = loaders[doc["model"]].from_state(doc["model_state"], arrays)
    except Exception as e:  # noqa: BLE001 - arrays of another model kind or shape
        raise UserError(
            f"{arr_path}: does not hold the arrays of the {doc['model']} model that {doc_path.name} describes "
            f"({type(e).__name__}: {first_line(e)}); fit the predictor again"
        ) from None
    return Predictor(
        doc["model"],
        regressor,
        space,
        workload,
        doc.get("fingerprint") or {},
        doc.get("columns"),
        doc.get("metrics") or {},
        doc.get("reference_ms"),
    )

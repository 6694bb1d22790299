"""Gradient-boosted trees (scikit-learn) on log latency, saved as plain node arrays.

scikit-learn fits; prediction walks the saved trees in numpy, so a predictor file holds
arrays only (no pickle) and loads without scikit-learn (tested equal to sklearn's predict).
"""

from __future__ import annotations

import numpy as np

from .base import register_predictor


@register_predictor
class GBT:
    kind = "gbt"

    def __init__(self, n_estimators: int = 400, learning_rate: float = 0.05, max_depth: int = 3, subsample: float = 0.8):
        self.n_estimators, self.learning_rate, self.max_depth, self.subsample = n_estimators, learning_rate, max_depth, subsample
        self.init = 0.0
        self.nodes: dict[str, np.ndarray] = {}

    def fit(self, x: np.ndarray, y: np.ndarray, seed: int = 0) -> "GBT":
        from sklearn.ensemble import GradientBoostingRegressor

        est = GradientBoostingRegressor(
            n_estimators=self.n_estimators, learning_rate=self.learning_rate, max_depth=self.max_depth,
            subsample=self.subsample, random_state=seed,
        ).fit(x, np.log(y))
        self.sklearn = est  # kept only in memory (tests compare against it); never saved
        self.init = float(est.init_.constant_.ravel()[0])
        left, right, feature, threshold, value, roots = [], [], [], [], [], []
        base = 0
        for tree in (t[0].tree_ for t in est.estimators_):
            roots.append(base)
            shift = lambda c: np.where(c >= 0, c + base, -1)  # noqa: E731
            left.append(shift(tree.children_left))
            right.append(shift(tree.children_right))
            feature.append(tree.feature)
            threshold.append(tree.threshold)
            value.append(tree.value[:, 0, 0] * self.learning_rate)
            base += tree.node_count
        self.nodes = {
            "left": np.concatenate(left), "right": np.concatenate(right), "feature": np.concatenate(feature),
            "threshold": np.concatenate(threshold), "value": np.concatenate(value), "roots": np.array(roots),
        }
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        n = self.nodes
        node = np.repeat(n["roots"][None, :], len(x), axis=0)  # (samples, trees)
        rows = np.arange(len(x))[:, None]
        while True:
            leaf = n["left"][node] < 0
            if leaf.all():
                break
            go_left = x[rows, np.maximum(n["feature"][node], 0)] <= n["threshold"][node]
            nxt = np.where(go_left, n["left"][node], n["right"][node])
            node = np.where(leaf, node, nxt)
        return np.exp(self.init + n["value"][node].sum(axis=1))

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        meta = {"n_estimators": self.n_estimators, "learning_rate": self.learning_rate, "max_depth": self.max_depth}
        meta.update(subsample=self.subsample, init=self.init)
        return meta, dict(self.nodes)

    @classmethod
    def from_state(cls, meta: dict, arrays: dict[str, np.ndarray]) -> "GBT":
        model = cls(meta["n_estimators"], meta["learning_rate"], meta["max_depth"], meta["subsample"])
        model.init, model.nodes = meta["init"], dict(arrays)
        return model

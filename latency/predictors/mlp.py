"""HAT-style MLP: standardised features -> 3 hidden ReLU layers -> log latency.

scikit-learn fits it (L-BFGS, seeded, L2 penalty); prediction is a few numpy matmuls over
the saved weights, so a predictor file holds arrays only.

Bounded: a subnet's standardised features are clamped to the box the training rows span (one standard deviation
beyond it; a column constant in training, such as an attention type no training row had, stays at its constant), and
the predicted log latency to the training rows' range widened by ``MARGIN`` each way.  Fitted on a small table, a
network fed a feature it never saw vary (unscaled FLOPs, 1e8 standard units) overflowed ``exp`` to an infinite
prediction and MAPE; bounded, it predicts within reach of what it was fitted on and cross-validation judges it.
"""

from __future__ import annotations

import warnings

import numpy as np

from .base import register_predictor, standardise

MARGIN = float(np.log(4.0))  # the predicted log latency stays within the training range widened by this, each way


@register_predictor
class MLP:
    kind = "mlp"

    def __init__(self, hidden: int = 128, layers: int = 3, max_iter: int = 1000, alpha: float = 1e-3):
        self.hidden, self.layers, self.max_iter, self.alpha = hidden, layers, max_iter, alpha
        self.weights: list[np.ndarray] = []
        self.mean = self.scale = None
        self.y_mean = self.y_scale = 0.0
        self.bounds: dict[str, np.ndarray] = {}  # "lo", "hi": the standardised input box; "y": the log-latency range

    def fit(self, x: np.ndarray, y: np.ndarray, seed: int = 0) -> "MLP":
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.neural_network import MLPRegressor
        from threadpoolctl import threadpool_limits

        self.mean, self.scale = standardise(x)
        ly = np.log(y)
        self.y_mean, self.y_scale = float(ly.mean()), float(ly.std() or 1.0)
        z = (x - self.mean) / self.scale
        varies = x.std(axis=0) > 0
        self.bounds = {"lo": np.where(varies, z.min(axis=0) - 1.0, 0.0), "hi": np.where(varies, z.max(axis=0) + 1.0, 0.0),
                       "y": np.array([ly.min() - MARGIN, ly.max() + MARGIN])}
        net = MLPRegressor(
            hidden_layer_sizes=(self.hidden,) * self.layers,
            solver="lbfgs",
            alpha=self.alpha,
            max_iter=self.max_iter,
            random_state=seed,
        )
        with warnings.catch_warnings(), threadpool_limits(1):  # small matrices: threads only wait on each other
            warnings.simplefilter("ignore", ConvergenceWarning)
            net.fit((x - self.mean) / self.scale, (ly - self.y_mean) / self.y_scale)
        self.weights = [w for pair in zip(net.coefs_, net.intercepts_) for w in pair]
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        h = (x - self.mean) / self.scale  # (n, d)
        if self.bounds:  # (a file written before the bounds has none: unbounded, as it was fitted)
            h = np.clip(h, self.bounds["lo"], self.bounds["hi"])
        for i in range(0, len(self.weights) - 2, 2):
            h = np.maximum(h @ self.weights[i] + self.weights[i + 1], 0.0)  # (n, hidden)
        z = (h @ self.weights[-2] + self.weights[-1])[:, 0]  # (n,)
        ly = z * self.y_scale + self.y_mean
        return np.exp(np.clip(ly, *self.bounds["y"]) if self.bounds else ly)

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        meta = {"hidden": self.hidden, "layers": self.layers, "max_iter": self.max_iter, "alpha": self.alpha}
        meta.update(y_mean=self.y_mean, y_scale=self.y_scale)
        bounds = {f"bound.{k}": v for k, v in self.bounds.items()}
        return meta, {"mean": self.mean, "scale": self.scale, **bounds, **{f"p{i}": w for i, w in enumerate(self.weights)}}

    @classmethod
    def from_state(cls, meta: dict, arrays: dict[str, np.ndarray]) -> "MLP":
        model = cls(meta["hidden"], meta["layers"], meta["max_iter"], meta["alpha"])
        model.y_mean, model.y_scale = meta["y_mean"], meta["y_scale"]
        model.mean, model.scale = arrays["mean"], arrays["scale"]
        model.weights = [arrays[f"p{i}"] for i in range(2 * (model.layers + 1))]
        model.bounds = {k[len("bound."):]: v for k, v in arrays.items() if k.startswith("bound.")}
        return model

"""Per-layer additive model: latency = constant + sum over layers of per-layer costs.

Each feature column is a count of work (e.g. summed over layers: T*E*A for the projections,
T^2*heads for softmax layers, one per layer of each attention type); the model learns one
non-negative cost per column (milliseconds per unit) by non-negative least squares on the
*relative* error, so small and large subnets weigh alike.  The fitted costs are readable
(``costs()``), and a depth never measured is just more of the same terms.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls

from .base import register_predictor


@register_predictor
class Additive:
    kind = "additive"

    def __init__(self, names: list[str] | None = None):
        self.names = names
        self.coef: np.ndarray | None = None

    @staticmethod
    def _with_const(x: np.ndarray) -> np.ndarray:
        return np.hstack([np.ones((len(x), 1)), x])  # column 0: the constant (per-call overhead)

    def fit(self, x: np.ndarray, y: np.ndarray, seed: int = 0) -> "Additive":
        x = self._with_const(x)
        scale = np.abs(x).max(axis=0)
        scale = np.where(scale > 0, scale, 1.0)
        a = (x / scale) / y[:, None]  # rows divided by y: minimise sum ((x w - y) / y)^2
        w, _ = nnls(a, np.ones_like(y), maxiter=50 * x.shape[1])
        self.coef = w / scale
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        assert self.coef is not None, "fit or load first"
        return np.maximum(self._with_const(x) @ self.coef, 1e-9)

    def costs(self) -> dict[str, float]:
        """Milliseconds per unit of each term (zero where the data gave it no cost)."""
        names = ["const"] + (self.names or [f"x{i}" for i in range(len(self.coef) - 1)])
        return dict(zip(names, self.coef.tolist()))

    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        return {"names": self.names}, {"coef": self.coef}

    @classmethod
    def from_state(cls, meta: dict, arrays: dict[str, np.ndarray]) -> "Additive":
        model = cls(meta.get("names"))
        model.coef = arrays["coef"]
        return model

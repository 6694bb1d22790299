"""Latency predictors: one model per file behind :class:`~latency.predictors.base.Regressor`,
wrapped by :class:`Predictor` (features, space, device fingerprint), chosen by ``select``.

Contract used elsewhere: :func:`load_predictor` ``(path) -> Predictor`` with
``.predict(subnets) -> np.ndarray`` (milliseconds), ``.space_hash``, ``.workload``,
``.fingerprint``, ``.name`` and ``.check_space(space)``.
"""

from .predictor import Predictor, load_predictor

__all__ = ["Predictor", "load_predictor"]

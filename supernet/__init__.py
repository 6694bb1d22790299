"""The SuperTransformer: attention types, elastic modules, the static Transformer and extraction."""

from . import attention
from .elastic import SuperTransformer, extract
from .artifact import load_model
from .model import Transformer, TransformerConfig

__all__ = ["SuperTransformer", "Transformer", "TransformerConfig", "attention", "extract", "load_model"]

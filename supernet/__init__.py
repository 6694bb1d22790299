"""The SuperTransformer: attention types, elastic modules, the static Transformer and extraction."""

from . import attention
from .elastic import SuperTransformer, extract
from .artifact import load_model
from .decode import DecodeCache, cache_bytes, decode_step, new_cache, prefill, synthetic_cache
from .model import Transformer, TransformerConfig

__all__ = [
    "DecodeCache",
    "SuperTransformer",
    "Transformer",
    "TransformerConfig",
    "attention",
    "cache_bytes",
    "decode_step",
    "extract",
    "load_model",
    "new_cache",
    "prefill",
    "synthetic_cache",
]

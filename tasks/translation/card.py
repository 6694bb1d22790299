"""What the README.md and config.json of an exported encoder-decoder say (:meth:`tasks.base.Task.card_facts` of the
translation task): the architecture in the keys of Hugging Face's encoder-decoders (``d_model``, ``encoder_layers``,
``decoder_layers``, heads and ffn widths per layer) plus HAT's cross-attention genes, the held-out cross-entropy and
chrF / BLEU once ``nas translate --eval`` has scored it, the corpus, and how to run it.
"""

from __future__ import annotations

from typing import Any

from search_spaces.version import __version__
from supernet.model_folder import Facts, Metric, stack_layers

from .data import BOS, EOS, PAD

MODEL_TYPE = "nas_transformer_seq2seq"

USAGE = '''With this toolkit (`pip install nas-transformers`), in this folder:

```bash
nas translate --model . "File not found" --beam 5
nas translate --model . --engine onnxruntime "File not found"   # the two ONNX graphs
nas translate --model . --eval test                              # chrF and BLEU on the corpus's test split
```

The ONNX graphs, named as optimum's encoder-decoders name theirs: `encoder.onnx` takes `input_ids` (batch, source)
int64 (the UTF-8 bytes; padding is the PAD id, no attention mask) and returns each decoder layer's
`present.{i}.encoder.key` / `.value` and `encoder_attention_mask.{i}`; `decoder_step.onnx` takes `input_ids` (batch, 1),
`position` (1,), the self-attention caches `past_key_values.{i}.decoder.key` / `.value` (other states
`past.{i}.{name}`), `past_key_values.{i}.encoder.key` / `.value` and the masks, and returns `logits` and
`present.{i}.decoder.*`. `tasks.translation.onnx.OnnxTranslation.load(".")` runs the greedy and beam loops on them.
'''


def translation_config(space, subnet) -> dict[str, Any]:
    """``config.json`` of a static encoder-decoder (:class:`tasks.translation.model.TranslationTransformer`)."""
    enc, dec = subnet.encoder, subnet.decoder
    return {
        "model_type": MODEL_TYPE,
        "task": space.task,
        "is_encoder_decoder": True,
        "vocab_size": space.vocab_size,
        "d_model": enc.embed_dim,
        "decoder_d_model": dec.embed_dim,
        "encoder_layers": enc.depth,
        "decoder_layers": dec.depth,
        "head_dim": space.head_dim,
        "encoder_attention_heads_per_layer": list(enc.heads),
        "decoder_attention_heads_per_layer": list(dec.heads),
        "cross_attention_heads_per_layer": list(subnet.cross_heads),
        "cross_attention_encoder_layers": list(subnet.cross_layers),
        "encoder_ffn_dim_per_layer": list(enc.ffn_dim),
        "decoder_ffn_dim_per_layer": list(dec.ffn_dim),
        "encoder_attention_types": list(enc.attention),
        "decoder_attention_types": list(dec.attention),
        "max_position_embeddings": space.max_seq_len,
        "position_embedding_type": "rotary" if space.positions == "rope" else "absolute",
        "activation_function": "gelu",
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "decoder_start_token_id": BOS,
        "tokenizer": "bytes: the UTF-8 bytes of the text are the ids 0-255; BOS, EOS and PAD after them",
        "nas_transformers_version": __version__,
        "space": space.name,
        "space_hash": space.hash,
    }


def translation_facts(task, space, subnet, card: dict[str, Any]) -> Facts:
    """The Facts of an exported encoder-decoder's folder."""
    v = card.get("validation") or {}
    metrics = []
    if "ce_per_target_byte" in v:
        metrics.append(Metric("validation cross-entropy", "cross_entropy", float(v["ce_per_target_byte"]),
                              "nats per target byte"))  # fmt: skip
    for key, q in sorted((card.get("quality") or {}).items()):
        split = key.split(".")[0]
        metrics += [Metric(f"chrF ({q.get('runtime', 'torch')}, beam {q.get('beam')})", "chrf", float(q["chrf"]), "chrF", split),
                    Metric(f"BLEU ({q.get('runtime', 'torch')}, beam {q.get('beam')})", "bleu", float(q["bleu"]), "BLEU", split)]
    c = card.get("corpus") or {}
    name = c.get("data") or f"{c.get('corpus') or 'gettext'} ({c.get('lang') or 'de'})"
    data = f"Trained on {name} (corpus hash {c.get('corpus_hash')}, split seed {c.get('data_seed')})."
    training = card.get("training")
    words = (f"Trained on its own (`nas train-subnet`): {training.get('steps')} steps." if training else
             "Weights inherited from the weight-shared encoder-decoder supernet (HAT's space), not retrained.")
    rows = [{**r, "index": f"encoder {r['index']}"} for r in stack_layers(space.encoder, subnet.encoder)]
    rows += [{**r, "index": f"decoder {r['index']}"} for r in stack_layers(space.decoder, subnet.decoder)]
    return Facts("translation", translation_config(space, subnet), "A byte-level encoder-decoder translation model",
                 tuple(metrics), (str(name),), data, words, USAGE, tags=("translation", "seq2seq", "byte-level"),
                 notes=(f"Cross-attention per decoder layer: heads {list(subnet.cross_heads)}, the last "
                        f"{list(subnet.cross_layers)} encoder layers (HAT's arbitrary encoder-decoder attention).",),
                 layers=tuple(rows), subnet=str(subnet))  # fmt: skip

"""What translating costs an encoder-decoder, analytically: HAT's ``translate`` workload, term by term.

A ``translate`` workload (source ``S`` bytes, ``N`` decoder steps, beam ``B``) is one encoder pass over the
source (batch 1), the cross-attention keys and values of every decoder layer computed once from its memory
(HAT's arbitrary encoder-decoder attention: ``k = cross_layers[i]`` encoder layers, ``k x S`` positions), then
``N`` cached decoder steps at batch ``B`` (step t: causal self-attention over t + 1 positions, cross-attention
over the ``k x S`` memory, MLP, the tied output projection).  FLOPs count a multiply-add as 2; the token mixing
is the attention type's own count (``prefill_flops`` for the encoder, an approximation: the types declare the
causal count, the bidirectional form sees about twice the pairs; ``decode_flops`` per decoder step).

These are the feature columns of a ``translate`` timing table and of its predictors
(:mod:`tasks.translation.timing`); every device times the workload (README "Translation (encoder-decoder)").
"""

from __future__ import annotations

from latency.features import layer_cache_bytes, projection_flops
from supernet.attention import get

from .space import TranslationSpace, TranslationSubnet, TranslationWorkload


def translate_terms(space: TranslationSpace, subnet: TranslationSubnet, workload: TranslationWorkload) -> dict[str, float]:
    """FLOPs of the encoder, the cross keys / values, the decoder's self-attention and MLP, its cross-attention and the
    output projection over the whole workload; the memory positions the cross-attention reads (the arbitrary
    attention's size) and the bytes of the decoder's caches read by the last step."""
    space.check(subnet)
    s, n, b, hd = workload.source, workload.steps, workload.beam, space.head_dim
    enc, dec = subnet.encoder, subnet.decoder
    ee, ed = enc.embed_dim, dec.embed_dim
    out = dict.fromkeys(("encoder", "cross_kv", "decoder_self", "decoder_mlp", "cross_attention", "head"), 0.0)
    for layer in enc.layers:
        spec = layer.attention_spec
        out["encoder"] += projection_flops(spec, s, ee, layer.heads, hd) + 2.0 * s * 2 * ee * layer.ffn_dim
        out["encoder"] += get(spec).prefill_flops(spec, 1, s, layer.heads, hd)
    memory, cache = 0.0, 0.0
    for layer, ch, k in zip(dec.layers, subnet.cross_heads, subnet.cross_layers):
        spec, a = layer.attention_spec, ch * hd
        typ = get(spec)
        m = k * s  # memory positions of this layer
        memory += m
        out["cross_kv"] += 2.0 * m * ee * a * 2  # k and v of the memory, once per source
        out["decoder_self"] += projection_flops(spec, n * b, ed, layer.heads, hd)
        out["decoder_self"] += sum(typ.decode_flops(spec, b, t, layer.heads, hd) for t in range(n))
        out["decoder_mlp"] += 2.0 * n * b * 2 * ed * layer.ffn_dim
        out["cross_attention"] += 2.0 * n * b * ed * a * 2 + 2.0 * n * b * ch * m * hd * 2  # q, o; scores and values
        cache += layer_cache_bytes(spec, n - 1, layer.heads, hd, b) + 4.0 * b * m * a * 2
    out["head"] = 2.0 * n * b * ed * space.vocab_size
    return {**{f"{k}_flops": v for k, v in out.items()}, "flops": sum(out.values()), "memory_positions": memory,
            "cache_bytes": cache}  # fmt: skip

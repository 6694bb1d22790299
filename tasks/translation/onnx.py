"""ONNX export of a static encoder-decoder (:class:`~tasks.translation.model.TranslationTransformer`): two graphs, and a
decoding loop on ONNX Runtime.

Named as optimum's encoder-decoders name theirs (the cross keys and values are the ``encoder`` half of the cache).
``encoder.onnx``: ``input_ids`` (batch, S) int64, S dynamic, the source bytes (padding is read off the PAD id: no
``attention_mask``) -> per decoder layer i ``present.{i}.encoder.key``, ``present.{i}.encoder.value`` (batch, cross
heads, k_i x S, head_dim) and ``encoder_attention_mask.{i}`` (batch, 1, 1, k_i x S) bool, True where a source byte
is real: what :func:`tasks.translation.model.encode_memory` computes once per source, HAT's arbitrary
encoder-decoder attention included (layer i reads the last k_i = ``cross_layers[i]`` encoder layers).

``decoder_step.onnx``: ``input_ids`` (batch, 1) int64, ``position`` (1,) int64, each decoder layer's self-attention
state laid out exactly as the LM's decode step (:mod:`supernet.onnx_decode`: a growing cache as
``past_key_values.{i}.decoder.key`` / ``.value`` (batch, Hkv, past, D), any other state as ``past.{i}.{name}``:
rolling windows, the linear family's ``s`` / ``z``, ...), then the encoder's keys, values and masks
(``past_key_values.{i}.encoder.key`` / ``.value``, ``encoder_attention_mask.{i}``) -> ``logits`` (batch, 1, vocab)
and ``present.{i}.decoder.key``, ``present.{i}.{name}``, to feed back (:func:`supernet.onnx_decode.past_of`) at the
next step.  Batch, ``past`` and each layer's memory length are dynamic.  Both
graphs carry their input layout in their metadata (``seq2seq_inputs``), so the loop below builds its inputs from
the graph files alone.  Beam search runs the step at batch B (one row per hypothesis; the encoder's outputs
repeated B times, and the states gathered by hypothesis between steps, as :mod:`tasks.translation.decode` does).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from search_spaces import UserError
from latency.timing_core import encoder_feed
from supernet.model import Step, attention_sublayer, embed, lm_head, mlp_sublayer, rope_at
from supernet.onnx_decode import POSITION, is_state, past_of, present_of, state_name
from supernet.onnx_export import DEFAULT_OPSET, INPUT_IDS, LOGITS, _quiet, check_inputs, onnx_session

from .data import BOS, EOS, PAD
from .model import Memory, TranslationTransformer, TranslationWeights, cross_attention, encode_memory

META_KEY = "seq2seq_inputs"
ENCODER, DECODER = "encoder.onnx", "decoder_step.onnx"
# example sizes traced: distinct, none 0 or 1 (the exporter would specialise on them)
_BATCH, _PAST, _SOURCE = 2, 3, 7


def decoder_states(model: TranslationTransformer) -> list[dict]:
    """Per decoder layer, what its self-attention type keeps while decoding: name -> StateSpec (as the LM's)."""
    hd = model.space.head_dim
    return [b.attn.typ.state(b.attn.spec, b.attn.heads, hd) for b in model.dec_blocks]


def cross_names(model: TranslationTransformer) -> list[str]:
    """The encoder graph's outputs: per decoder layer its cross keys, values (``present.{i}.encoder.*``) and mask."""
    return [n for i in range(len(model.dec_blocks))
            for n in (f"present.{i}.encoder.key", f"present.{i}.encoder.value", f"encoder_attention_mask.{i}")]  # fmt: skip


def is_self_state(name: str) -> bool:
    """Whether a decoder-step input is a self-attention state fed back step by step (not the encoder's keys)."""
    return is_state(name) and ".encoder." not in name


def step_layout(model: TranslationTransformer) -> dict[str, dict]:
    """Every input of the decoder-step graph: name -> {"shape": [...] ("batch", "past", "memory.{i}" dynamic), "dtype"}."""
    space, hd = model.space, model.space.head_dim
    layout = {
        INPUT_IDS: {"shape": ["batch", 1], "dtype": "int64", "vocab_size": space.vocab_size, "start": BOS},
        POSITION: {"shape": [1], "dtype": "int64", "limit": space.max_seq_len if space.positions == "learned" else None},
    }
    for i, states in enumerate(decoder_states(model)):
        for name, s in states.items():
            layout[state_name(i, name, s.grows, "decoder")] = {"shape": ["batch", *s.shape], "dtype": "float32",
                                                              "positive": s.positive}  # fmt: skip
    for i, c in enumerate(model.cross):
        heads = c.q.out_features // hd
        for n in ("key", "value"):
            layout[f"past_key_values.{i}.encoder.{n}"] = {"shape": ["batch", heads, f"memory.{i}", hd], "dtype": "float32"}
        layout[f"encoder_attention_mask.{i}"] = {"shape": ["batch", 1, 1, f"memory.{i}"], "dtype": "bool"}
    return layout


def step_outputs(layout: dict[str, dict]) -> list[str]:
    return [LOGITS] + [present_of(n) for n in layout if is_self_state(n)]


class EncoderGraph(nn.Module):
    """input_ids (B, S) -> per decoder layer its cross key, value and mask (:func:`cross_names`): :func:`encode_memory`
    flattened."""

    def __init__(self, model: TranslationTransformer):
        super().__init__()
        self.model = model

    def forward(self, source: Tensor) -> tuple[Tensor, ...]:
        mem = encode_memory(self.model.weights(), source)
        return tuple(t for (k, v), m in zip(mem.kv, mem.mask) for t in (k, v, m))


def decoder_step(w: TranslationWeights, token: Tensor, position: Tensor, states: list[dict], mem: Memory) -> tuple[Tensor, list]:
    """One decoder step, functional (growing caches hold exactly the past; the new entry is concatenated):
    token (B, 1) at ``position`` (1,) -> logits (B, 1, V) and each layer's next state (:func:`tasks.translation.model.decode`
    with :class:`~supernet.model.Step` caches, the position a tensor so that it traces)."""
    x = embed(token, w.dec_tok, w.dec_pos, position if w.dec_pos is not None else None)  # (B, 1, Ed)
    rope = rope_at(position, w.head_dim) if w.positions == "rope" else None
    new = []
    for i, (bw, spec, c) in enumerate(zip(w.dec_blocks, w.dec_specs, w.cross)):
        x, state = attention_sublayer(x, bw, spec, w.head_dim, rope, Step(states[i], position, None))
        x = cross_attention(x, c, mem.kv[i], mem.mask[i], w.head_dim)
        x = mlp_sublayer(x, bw)
        new.append(state)
    return lm_head(x, w.ln_dec, w.dec_tok), new  # (B, 1, V)


class DecoderStepGraph(nn.Module):
    """(token, position, *past, *cross) -> (logits, *present), flat tensors in the order of :func:`step_layout`."""

    def __init__(self, model: TranslationTransformer):
        super().__init__()
        self.model = model
        self.names = [list(s) for s in decoder_states(model)]

    def forward(self, token: Tensor, position: Tensor, *rest: Tensor) -> tuple[Tensor, ...]:
        flat = iter(rest)
        states = [{name: next(flat) for name in names} for names in self.names]
        kv, masks = [], []
        for _ in self.names:
            kv.append((next(flat), next(flat)))
            masks.append(next(flat))
        logits, new = decoder_step(self.model.weights(), token, position, states, Memory(tuple(kv), tuple(masks)))
        return (logits, *(layer[name] for layer, names in zip(new, self.names) for name in names))


def _example(layout: dict[str, dict], sizes: dict[str, int]) -> list[Tensor]:
    out = []
    for name, spec in layout.items():
        shape = [sizes[d] if isinstance(d, str) else d for d in spec["shape"]]
        if spec["dtype"] == "bool":
            out.append(torch.ones(shape, dtype=torch.bool))
        elif spec["dtype"] == "int64":
            out.append(torch.full(shape, sizes["past"] if name == POSITION else 1, dtype=torch.long))
        else:
            t = torch.randn(shape)
            out.append(t.abs() + 1.0 if spec.get("positive") else t)
    return out


def export_translation_onnx(model: TranslationTransformer, directory: str | Path, *,
                            opset: int = DEFAULT_OPSET) -> tuple[Path, Path]:
    """Write ``encoder.onnx`` and ``decoder_step.onnx`` of ``model`` into ``directory``; return their paths."""
    import onnx

    if model.enc_tok.weight.dtype != torch.float32:
        raise UserError(f"seq2seq ONNX export: weights of dtype {model.enc_tok.weight.dtype}; expected float32")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = model.eval()
    space = model.space
    Dim = torch.export.Dim
    batch, seq = Dim("batch", max=4096), Dim("source", min=1, max=space.max_seq_len)
    source = torch.randint(0, 256, (_BATCH, max(_SOURCE, min(space.max_seq_len, 2 * _SOURCE + 1))))
    enc_layout = {INPUT_IDS: {"shape": ["batch", "source"], "dtype": "int64", "vocab_size": space.vocab_size,
                              "limit": space.max_seq_len}}  # fmt: skip
    encoder = _export(EncoderGraph(model), (source,), ({0: batch, 1: seq},), [INPUT_IDS], cross_names(model),
                      directory / ENCODER, opset)  # fmt: skip
    layout = step_layout(model)
    memory = [Dim(f"memory_{i}", min=1, max=k * space.max_seq_len) for i, k in enumerate(model.subnet.cross_layers)]
    past = Dim("past", max=1 << 20)
    sizes = {"batch": _BATCH, "past": _PAST}
    sizes.update({f"memory.{i}": source.shape[1] * k for i, k in enumerate(model.subnet.cross_layers)})
    dims = {"batch": batch, "past": past, **{f"memory.{i}": m for i, m in enumerate(memory)}}
    dynamic = [{a: dims[d] for a, d in enumerate(spec["shape"]) if isinstance(d, str)} or None for spec in layout.values()]
    step = _export(DecoderStepGraph(model), tuple(_example(layout, sizes)), (dynamic[0], dynamic[1], tuple(dynamic[2:])),
                   list(layout), step_outputs(layout), directory / DECODER, opset)  # fmt: skip
    for path, lay in ((encoder, enc_layout), (step, layout)):
        graph = onnx.load(str(path))
        graph.metadata_props.add(key=META_KEY, value=json.dumps(lay))
        onnx.save(graph, str(path))
    return encoder, step


def _export(module, example, dynamic, inputs, outputs, path: Path, opset: int) -> Path:
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(module.eval(), example, dynamo=True, opset_version=opset, dynamic_shapes=dynamic,
                                    input_names=inputs, output_names=outputs, verbose=False)  # fmt: skip
        program.save(str(path))
    return path


def read_layout(session, where: str = "the ONNX session") -> dict[str, dict]:
    """The input layout stored in a graph of :func:`export_translation_onnx` (an ONNX Runtime session); a graph of an older
    export (``source``, ``token``, ``cross.*``) is refused in one line naming ``where``."""
    props = session.get_modelmeta().custom_metadata_map
    if META_KEY not in props:
        raise UserError(f"{where}: not a seq2seq graph (no {META_KEY!r} metadata); write one with export_translation_onnx")
    layout = json.loads(props[META_KEY])
    check_inputs(layout, where)
    return layout


# --------------------------------------------------------------------------- decoding on ONNX Runtime


class OnnxTranslation:
    """The two sessions of an exported encoder-decoder: ``encode`` a source once, then ``step`` one token per row."""

    def __init__(self, encoder, step, where: str = "the ONNX sessions"):
        check_inputs([i.name for i in encoder.get_inputs()], where)
        self.encoder, self.step_session = encoder, step
        self.layout = read_layout(step, where)
        self.outputs = [o.name for o in step.get_outputs()]
        self.cross = [o.name for o in encoder.get_outputs()]
        self.cross_inputs = list(encoder_feed(self.cross, [np.zeros((1,))] * len(self.cross), 1))  # the step's names

    @classmethod
    def load(cls, directory: str | Path, threads: int | None = None) -> "OnnxTranslation":
        directory = Path(directory)
        for name in (ENCODER, DECODER):
            if not (directory / name).is_file():
                raise UserError(f"{directory / name}: not found (write it with nas export of a seq2seq subnet)")
        return cls(onnx_session(directory / ENCODER, threads), onnx_session(directory / DECODER, threads), str(directory))

    def encode(self, source: np.ndarray, batch: int) -> dict[str, np.ndarray]:
        """source (1, S) int64 -> the encoder's keys, values and masks as the step's inputs, repeated to ``batch`` rows."""
        outs = self.encoder.run(self.cross, {INPUT_IDS: np.ascontiguousarray(source, dtype=np.int64)})
        return encoder_feed(self.cross, outs, batch)

    def start(self, cross: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The first step's inputs: empty caches and zero states at the batch of ``cross``, the token still to set."""
        batch = next(iter(cross.values())).shape[0]
        feed = {}
        for name, spec in self.layout.items():
            if is_self_state(name):
                shape = [{"batch": batch, "past": 0}.get(d, d) if isinstance(d, str) else d for d in spec["shape"]]
                feed[name] = np.zeros(shape, dtype=spec["dtype"])
        return {**feed, **cross, INPUT_IDS: np.full((batch, 1), BOS, dtype=np.int64), POSITION: np.zeros(1, np.int64)}

    def step(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        """Run one step on ``feed``, update its states and position in place: logits (B, V)."""
        outs = self.step_session.run(self.outputs, feed)
        for name, value in zip(self.outputs[1:], outs[1:]):
            feed[past_of(name)] = value
        feed[POSITION] = feed[POSITION] + 1
        return outs[0][:, -1]

    @staticmethod
    def reorder(feed: dict[str, np.ndarray], index: np.ndarray) -> None:
        """Keep the rows ``index`` of the states (beam search: each hypothesis its parent's cache)."""
        for name in [n for n in feed if is_self_state(n)]:
            feed[name] = feed[name][index]


def onnx_logits(model: OnnxTranslation, source: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    """Teacher forcing through the step graph from empty caches: source (1, S), decoder inputs tgt (B, T) -> (B, T, V)."""
    feed = model.start(model.encode(source, tgt.shape[0]))
    outs = []
    for t in range(tgt.shape[1]):
        feed[INPUT_IDS] = np.ascontiguousarray(tgt[:, t : t + 1], dtype=np.int64)
        outs.append(model.step(feed))
    return np.stack(outs, axis=1)


@torch.no_grad()
def translation_parity(model: TranslationTransformer, directory: str | Path, *, source: int = 11, steps: int = 8, batch: int = 2,
                       seed: int = 0) -> dict[str, float]:  # fmt: skip
    """Max abs differences between ONNX Runtime and torch: ``encoder`` (every cross key / value) over a random source
    of ``source`` bytes, and ``decoder_step`` (logits of ``steps`` steps at ``batch`` rows, cache fed back)."""
    from .model import decode

    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 256, (1, min(source, model.space.max_seq_len)), generator=g)  # (1, S)
    tgt = torch.randint(0, 256, (batch, min(steps, model.space.max_seq_len)), generator=g)  # (B, T)
    tgt[:, 0] = BOS
    w = model.eval().weights()
    mem = encode_memory(w, src)
    ort = OnnxTranslation.load(directory)
    cross = ort.encode(src.numpy(), 1)
    enc = max(float(np.abs(cross[f"past_key_values.{i}.encoder.{n}"] - t.numpy()).max()) for i, kv in enumerate(mem.kv)
              for n, t in zip(("key", "value"), kv))  # fmt: skip
    ref, _ = decode(w, tgt, mem.select(torch.zeros(batch, dtype=torch.long)))
    dec = float(np.abs(onnx_logits(ort, src.numpy(), tgt.numpy()) - ref.numpy()).max())
    return {"encoder": enc, "decoder_step": dec}


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    lp = x - np.log(np.exp(x).sum(-1, keepdims=True))
    lp[:, PAD] = lp[:, BOS] = -np.inf
    return lp


def onnx_greedy(model: OnnxTranslation, source: bytes, max_len: int) -> tuple[list[int], float]:
    """Greedy decoding through the two graphs: the generated ids (EOS last if it ended) and their summed log-probability."""
    if not source:
        raise UserError("the source text is empty")
    feed = model.start(model.encode(np.array([list(source)], dtype=np.int64), 1))
    tokens, score = [], 0.0
    for _ in range(max_len):
        lp = _log_softmax(model.step(feed))[0]
        tok = int(lp.argmax())
        tokens.append(tok)
        score += float(lp[tok])
        if tok == EOS:
            break
        feed[INPUT_IDS] = np.array([[tok]], dtype=np.int64)
    return tokens, score


class OnnxBeams:
    """Next-byte log-probabilities of live hypotheses through the step graph (one source, its cross keys / values
    computed once): the decoder :func:`tasks.translation.decode.search_beams` drives, as it drives torch's."""

    def __init__(self, model: OnnxTranslation, source: bytes):
        if not source:
            raise UserError("the source text is empty")
        self.model = model
        self.feed = model.start(model.encode(np.array([list(source)], dtype=np.int64), 1))

    def __call__(self, prefixes: torch.Tensor) -> torch.Tensor:
        self.feed[INPUT_IDS] = np.ascontiguousarray(prefixes[:, -1:].numpy(), dtype=np.int64)  # the cache holds the rest
        return torch.from_numpy(_log_softmax(self.model.step(self.feed)))

    def reorder(self, index: torch.Tensor) -> None:
        rows = index.numpy()
        self.model.reorder(self.feed, rows)
        for name in self.model.cross_inputs:  # every row reads the same source
            self.feed[name] = self.feed[name][np.zeros(len(rows), dtype=np.int64)]


def onnx_translate(model: OnnxTranslation, source: bytes, max_seq_len: int, beam: int = 1, max_len: int | None = None):
    """The best translation of ``source`` through the two graphs: greedy for ``beam`` 1, else beam search (the
    same search as torch's :func:`tasks.translation.decode.translate`); a :class:`~tasks.translation.decode.Hypothesis`."""
    from .decode import Hypothesis, decode_limit, search_beams

    limit = decode_limit(source, max_seq_len, max_len)
    if beam == 1:
        tokens, score = onnx_greedy(model, source, limit)
        return Hypothesis(tuple(tokens), score, bool(tokens) and tokens[-1] == EOS)
    return search_beams(OnnxBeams(model, source), beam, limit)[0]


__all__ = ["DECODER", "ENCODER", "OnnxBeams", "OnnxTranslation", "decoder_step", "export_translation_onnx", "onnx_greedy",
           "onnx_logits", "onnx_translate", "translation_parity", "step_layout"]  # fmt: skip

"""Encoder-decoder spaces (``task: seq2seq``, translation): HAT's elastic SuperTransformer space.

An encoder (bidirectional self-attention, then MLP, per layer) reads the source; a decoder (causal
self-attention, then cross-attention over the encoder's output, then MLP) writes the target.  As in
HAT (Wang et al., 2020) the choices are: the encoder's and the decoder's embedding widths
separately, their depths, per layer the heads, FFN width and attention type of the self-attention
on each side, per decoder layer the heads of its cross-attention, and HAT's *arbitrary
encoder-decoder attention*: decoder layer i attends to the last ``cross_layers[i]`` (1, 2 or 3)
encoder layers, whose outputs are concatenated along the sequence (the final, normalised output,
then the raw outputs of the layers before it: HAT's ``encoder_out`` and ``encoder_out_all[-2]``,
``[-3]``), so the keys and values of that layer span ``cross_layers[i] x S`` source positions.

The format (``translate-tiny.yaml`` is annotated)::

    task: seq2seq
    vocab_size: 259          # bytes + PAD, BOS, EOS (tasks.translation.data)
    max_seq_len: 128         # longest source and longest target + 1, in bytes
    head_dim: 32
    positions: rope
    encoder: {embed_dim: [...], depth: [...], layers: {heads, ffn_dim, attention}}
    decoder: {embed_dim: [...], depth: [...], layers: {heads, ffn_dim, attention, cross_heads, cross_layers}}
    latency:
      translate: {source: 30, steps: 30, beam: 5}

Each side is also a one-stack :class:`~search_spaces.space.Space` (``space.encoder`` of bidirectional
attention, ``space.decoder`` of causal attention), so the elastic blocks, the attention-type checks and the
per-side subnets and genes are the one-stack ones.
"""

from __future__ import annotations

import math
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from search_spaces.attention import has_form, parse_attention, spec_problems
from search_spaces.errors import SpaceError, SubnetError, UserError, shown
from search_spaces.tasks import with_form
from search_spaces.space import (POSITIONS, WORKLOAD_KINDS, Checker, Space, SpaceIdentity, Subnet, SubnetFile, TokenizerSpec,
                                 check_vocab_size, is_int, parse_tokenizer)

TASK = "seq2seq"
VOCAB_SIZE = 259  # 256 bytes + PAD (256), BOS (257), EOS (258): tasks.translation.data
SIDES = {"encoder": "bidirectional", "decoder": "causal"}  # the attention form of each side's self-attention
CROSS_LAYERS = (1, 2, 3)  # HAT's arbitrary encoder-decoder attention: the last 1, 2 or 3 encoder layers
TRANSLATE = "translate"


# --------------------------------------------------------------------------- subnet


@dataclass(frozen=True)
class Seq2SeqSubnet(SubnetFile):
    """One encoder-decoder architecture: each side an LM :class:`Subnet`, plus per decoder layer the heads of its
    cross-attention and how many of the last encoder layers it attends to."""

    encoder: Subnet
    decoder: Subnet
    cross_heads: tuple[int, ...]
    cross_layers: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in ("cross_heads", "cross_layers"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or len(value) != self.decoder.depth:
                raise SubnetError(f"subnet.decoder.{name}: expected a tuple of {self.decoder.depth} (decoder depth) "
                                  f"positive integers, got {shown(value)}")  # fmt: skip
            for i, v in enumerate(value):
                if not is_int(v) or v < 1:
                    raise SubnetError(f"subnet.decoder.{name}[{i}]: {shown(v)} is not a positive integer")

    @property
    def attention(self) -> tuple[str, ...]:
        """Every self-attention layer's type, the encoder's then the decoder's (what a type-balanced sandwich counts)."""
        return self.encoder.attention + self.decoder.attention

    @property
    def stacks(self) -> tuple[Subnet, Subnet]:
        """The encoder's and the decoder's self-attention stacks (what a ranker of shapes reads)."""
        return self.encoder, self.decoder

    def to_dict(self) -> dict[str, Any]:
        dec = {**self.decoder.to_dict(), "cross_heads": list(self.cross_heads), "cross_layers": list(self.cross_layers)}
        return {"encoder": self.encoder.to_dict(), "decoder": dec}

    @classmethod
    def from_dict(cls, data: Any, where: str = "subnet") -> "Seq2SeqSubnet":
        if isinstance(data, dict) and {"embed_dim", "depth"} <= set(data):
            raise SubnetError(f"{where}: a decoder-only subnet (keys embed_dim, depth, heads, ffn_dim, attention), not one "
                              "of this encoder-decoder space (keys encoder and decoder): the subnet is of another space")
        if not isinstance(data, dict) or set(data) != {"encoder", "decoder"}:
            raise SubnetError(f"{where}: expected a mapping with keys encoder and decoder, got {shown(data)}")
        dec = data["decoder"]
        if not isinstance(dec, dict) or "cross_heads" not in dec or "cross_layers" not in dec:
            raise SubnetError(f"{where}.decoder: expected a mapping with cross_heads and cross_layers beside "
                              "embed_dim, depth, heads, ffn_dim, attention")  # fmt: skip
        cross = {k: dec[k] for k in ("cross_heads", "cross_layers")}
        for k, v in cross.items():
            if not isinstance(v, (list, tuple)):
                raise SubnetError(f"{where}.decoder.{k}: expected a list, got {shown(v)}")
        encoder = Subnet.from_dict(data["encoder"], f"{where}.encoder")
        decoder = Subnet.from_dict({k: v for k, v in dec.items() if k not in cross}, f"{where}.decoder")
        return cls(encoder, decoder, tuple(cross["cross_heads"]), tuple(cross["cross_layers"]))

    def __str__(self) -> str:
        cross = ", ".join(f"{h}h/{k}L" for h, k in zip(self.cross_heads, self.cross_layers))
        return f"enc {self.encoder} | dec {self.decoder} | cross [{cross}]"


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class TranslateWorkload:
    """HAT's latency protocol in bytes: one encoder pass over ``source`` bytes, then ``steps`` decoder steps with the
    self-attention cache at beam width ``beam`` (HAT: 30 tokens, beam 5); ``nas measure-latency --device cpu`` times it."""

    name: str
    source: int
    steps: int
    beam: int
    kind: str = TRANSLATE

    @property
    def shape(self) -> str:
        return f"{self.source}->{self.steps}x{self.beam}"

    @property
    def label(self) -> str:
        return f"{self.name}:{self.shape}"

    def __str__(self) -> str:
        return f"{self.name} (translate {self.source} source bytes, {self.steps} steps at beam {self.beam})"

    def to_dict(self) -> dict[str, Any]:
        out = {"source": self.source, "steps": self.steps, "beam": self.beam}
        return out if self.name == TRANSLATE else {"kind": TRANSLATE, **out}

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "source": self.source, "steps": self.steps, "beam": self.beam}

    @classmethod
    def from_record(cls, data: dict, where: str = "workload") -> "TranslateWorkload":
        """Inverse of :meth:`record`."""
        try:
            out = cls(str(data["name"]), int(data["source"]), int(data["steps"]), int(data["beam"]))
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{where}: not a translate workload record (name, source, steps, beam): {e!r}") from None
        return out


# --------------------------------------------------------------------------- space


@dataclass(frozen=True)
class Seq2SeqSpace(SpaceIdentity):
    """An encoder-decoder search space: each side as an LM space, plus the cross-attention choices."""

    name: str
    vocab_size: int
    max_seq_len: int
    head_dim: int
    positions: str
    encoder: Space
    decoder: Space
    cross_heads: tuple[int, ...]
    cross_layers: tuple[int, ...]
    workloads: tuple[TranslateWorkload, ...]
    source: str = field(default="<memory>", compare=False)
    task: str = TASK
    # bytes (the default), or one joint byte-level BPE of source and target (HAT's; tokenizer: {bpe: N}: PAD, BOS and
    # EOS at 256-258, the merges after them; tasks.translation.data.tokenize_pairs)
    tokenizer: TokenizerSpec = field(default=TokenizerSpec(base=VOCAB_SIZE), kw_only=True)

    causal = False  # the LM commands' check: this is not a decoder-only LM
    subnet_type = Seq2SeqSubnet  # (class attributes, not fields)

    def require_one_stack(self, command: str) -> None:
        raise UserError(
            f"{self.source}: task seq2seq: `nas {command}` does not run encoder-decoder spaces (README \"Translation "
            "(encoder-decoder)\": train-supernet, train-subnet, measure-latency, fit-predictor, predict, search, "
            "export and translate do)"
        )

    @property
    def max_cross_heads(self) -> int:
        return max(self.cross_heads)

    # -- members ------------------------------------------------------------------

    @property
    def attention(self) -> tuple[str, ...]:
        """The attention types both sides offer, in the encoder's order: what the type-balanced sandwich
        (``train-supernet --balance types``) rotates its largest and smallest subnets over."""
        return tuple(a for a in self.encoder.attention if a in self.decoder.attention)

    def largest(self, attention: str | None = None) -> Seq2SeqSubnet:
        """Both sides' largest, every self-attention layer of type ``attention`` (default: each side's first listed);
        every cross-attention with the most heads over the most encoder layers."""
        self._check_type(attention)
        d = self.decoder.max_depth
        return Seq2SeqSubnet(self.encoder.largest(attention), self.decoder.largest(attention), (self.max_cross_heads,) * d,
                             (max(self.cross_layers),) * d)  # fmt: skip

    def smallest(self, attention: str | None = None) -> Seq2SeqSubnet:
        """Both sides' smallest, every self-attention layer of type ``attention`` (default: each side's first listed)."""
        self._check_type(attention)
        d = min(self.decoder.depth)
        return Seq2SeqSubnet(self.encoder.smallest(attention), self.decoder.smallest(attention), (min(self.cross_heads),) * d,
                             (min(self.cross_layers),) * d)  # fmt: skip

    def _check_type(self, attention: str | None) -> None:
        if attention is not None and attention not in self.attention:
            raise ValueError(f"attention type {attention!r} is not offered by both sides of space {self.name!r} "
                             f"({', '.join(self.attention)})")  # fmt: skip

    def uniform(self) -> list[Seq2SeqSubnet]:
        """Every hand-scaled encoder-decoder of the space: one width for both sides, every layer of both sides the same
        heads, FFN width and attention type, every decoder layer's cross-attention the same heads over the same last
        encoder layers (where the space allows each choice).  The search opens with each type's largest under a budget;
        the benchmarks take their baselines from them."""
        enc, dec = self.encoder, self.decoder
        out = []
        grid = itertools.product(sorted(set(enc.embed_dim) & set(dec.embed_dim)), enc.depth, dec.depth, enc.heads,
                                 enc.ffn_dim, self.attention, self.cross_layers)  # fmt: skip
        for e, de, dd, h, f, a, k in grid:
            if h not in dec.heads or f not in dec.ffn_dim or h not in self.cross_heads:
                continue
            s = Seq2SeqSubnet(Subnet(e, de, (h,) * de, (f,) * de, (a,) * de), Subnet(e, dd, (h,) * dd, (f,) * dd, (a,) * dd),
                              (h,) * dd, (k,) * dd)  # fmt: skip
            if not self.problems(s):
                out.append(s)
        return out

    def lightest(self) -> list[Seq2SeqSubnet]:
        """The search's first candidates for a tight budget: the smallest subnet."""
        return [self.smallest()]

    def sample(self, rng: np.random.Generator) -> Seq2SeqSubnet:
        """Each choice uniformly and independently: the encoder, the decoder, then the decoder's cross choices."""
        enc, dec = self.encoder.sample(rng), self.decoder.sample(rng)
        heads = tuple(int(x) for x in rng.choice(self.cross_heads, size=dec.depth))
        layers = tuple(int(x) for x in rng.choice(self.cross_layers, size=dec.depth))
        return Seq2SeqSubnet(enc, dec, heads, layers)

    # -- genes --------------------------------------------------------------------

    def _cross_genes(self, depth: int, parents: Sequence[Seq2SeqSubnet], pick) -> tuple[tuple, tuple]:
        heads, layers = [], []
        for i in range(depth):
            for out, name, choices in ((heads, "cross_heads", self.cross_heads), (layers, "cross_layers", self.cross_layers)):
                out.append(int(pick(i, [getattr(p, name)[i] for p in parents if i < p.decoder.depth], choices)))
        return tuple(heads), tuple(layers)

    def mutate(self, parent: Seq2SeqSubnet, rng: np.random.Generator, prob: float) -> Seq2SeqSubnet:
        """The encoder and the decoder mutated as one-stack subnets of their sides; each decoder layer's cross heads and
        encoder layers redrawn with probability ``prob`` (drawn fresh on layers a deeper child gains)."""
        enc, dec = self.encoder.mutate(parent.encoder, rng, prob), self.decoder.mutate(parent.decoder, rng, prob)

        def pick(_i: int, have: list, choices: tuple):
            return have[0] if have and rng.random() >= prob else choices[int(rng.integers(len(choices)))]

        return Seq2SeqSubnet(enc, dec, *self._cross_genes(dec.depth, (parent,), pick))

    def crossover(self, a: Seq2SeqSubnet, b: Seq2SeqSubnet, rng: np.random.Generator) -> Seq2SeqSubnet:
        """Each side crossed as one-stack subnets; each cross gene from a parent that has the layer."""
        enc = self.encoder.crossover(a.encoder, b.encoder, rng)
        dec = self.decoder.crossover(a.decoder, b.decoder, rng)

        def pick(_i: int, have: list, _choices: tuple):
            return have[int(rng.integers(len(have)))]

        return Seq2SeqSubnet(enc, dec, *self._cross_genes(dec.depth, (a, b), pick))

    def genes(self, subnet: Seq2SeqSubnet) -> dict[str, tuple[Any, tuple]]:
        """Each side's genes as a one-stack subnet's (prefixed ``enc.`` / ``dec.``), then the cross genes per decoder
        layer: ``(value, choices)`` by name."""
        out: dict[str, tuple[Any, tuple]] = {}
        for prefix, side, sub in (("enc.", self.encoder, subnet.encoder), ("dec.", self.decoder, subnet.decoder)):
            out.update({prefix + k: v for k, v in side.genes(sub).items()})
        for i in range(subnet.decoder.depth):
            for name, choices in (("cross_heads", self.cross_heads), ("cross_layers", self.cross_layers)):
                out[f"dec.l{i}.{name}"] = (getattr(subnet, name)[i], choices)
        return out

    def problems(self, subnet: Seq2SeqSubnet) -> list[str]:
        out = [f"encoder.{p}" for p in self.encoder.problems(subnet.encoder)]
        out += [f"decoder.{p}" for p in self.decoder.problems(subnet.decoder)]
        for name, allowed in (("cross_heads", self.cross_heads), ("cross_layers", self.cross_layers)):
            for i, v in enumerate(getattr(subnet, name)):
                if v not in allowed:
                    out.append(f"decoder.{name}[{i}]: {shown(v)} is not one of {', '.join(map(str, allowed))}")
        return out

    def size(self) -> int:
        cross = len(self.cross_heads) * len(self.cross_layers)
        dec_layer = len(self.decoder.heads) * len(self.decoder.ffn_dim) * len(self.decoder.attention) * cross
        dec = len(self.decoder.embed_dim) * sum(dec_layer**d for d in self.decoder.depth)
        return self.encoder.size() * dec

    # -- features -----------------------------------------------------------------

    def feature_names(self) -> list[str]:
        enc = [f"enc.{n}" for n in self.encoder.feature_names()]
        dec = ["dec.embed_dim", "dec.depth"]
        for i in range(self.decoder.max_depth):
            dec += [f"dec.l{i}.active", f"dec.l{i}.heads", f"dec.l{i}.ffn_dim"]
            dec += [f"dec.l{i}.attn={a}" for a in self.decoder.attention]
            dec += [f"dec.l{i}.cross_heads", f"dec.l{i}.cross_layers"]
        return enc + dec

    def encode(self, subnet: Seq2SeqSubnet) -> np.ndarray:
        """Fixed-length float vector: the encoder's LM features, then the decoder's with each layer's cross-attention
        heads and encoder layers after its own (active, heads, ffn_dim, one-hot type)."""
        self.check(subnet)
        enc = self.encoder.encode(subnet.encoder)
        dec = self.decoder.encode(subnet.decoder)
        per = 3 + len(self.decoder.attention)
        out = [enc, dec[:2]]
        for i in range(self.decoder.max_depth):
            cross = (subnet.cross_heads[i], subnet.cross_layers[i]) if i < subnet.decoder.depth else (0, 0)
            out += [dec[2 + i * per : 2 + (i + 1) * per], np.asarray(cross, dtype=np.float64)]
        return np.concatenate(out)

    def decode(self, vec: np.ndarray) -> Seq2SeqSubnet:
        """Inverse of :meth:`encode`."""
        vec = np.asarray(vec, dtype=np.float64)
        n_enc = len(self.encoder.feature_names())
        per = 3 + len(self.decoder.attention)
        n = n_enc + 2 + self.decoder.max_depth * (per + 2)
        if vec.shape != (n,):
            raise SubnetError(f"feature vector has shape {vec.shape}, space {self.name!r} expects ({n},)")
        dec, cross = [vec[n_enc : n_enc + 2]], []
        for i in range(self.decoder.max_depth):
            base = n_enc + 2 + i * (per + 2)
            dec.append(vec[base : base + per])
            cross.append(vec[base + per : base + per + 2])
        decoder = self.decoder.decode(np.concatenate(dec))
        heads = tuple(int(round(c[0])) for c in cross[: decoder.depth])
        layers = tuple(int(round(c[1])) for c in cross[: decoder.depth])
        return self.check(Seq2SeqSubnet(self.encoder.decode(vec[:n_enc]), decoder, heads, layers))

    # -- identity -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        def side(s: Space, extra: dict) -> dict:
            layers = {"heads": list(s.heads), "ffn_dim": list(s.ffn_dim), "attention": list(s.attention), **extra}
            return {"embed_dim": list(s.embed_dim), "depth": list(s.depth), "layers": layers}

        cross = {"cross_heads": list(self.cross_heads), "cross_layers": list(self.cross_layers)}
        return {
            "name": self.name,
            "task": self.task,
            "vocab_size": self.vocab_size,
            "max_seq_len": self.max_seq_len,
            "head_dim": self.head_dim,
            "positions": self.positions,
            "encoder": side(self.encoder, {}),
            "decoder": side(self.decoder, cross),
            "latency": {w.name: w.to_dict() for w in self.workloads},
            **({"tokenizer": self.tokenizer.to_dict()} if self.tokenizer.bpe else {}),  # a byte space's hash is unchanged
        }


# --------------------------------------------------------------------------- loading


def parse_seq2seq(data: dict, where: str, source: str) -> Seq2SeqSpace:
    """Validate a ``task: seq2seq`` mapping (already YAML-loaded); raise :class:`SpaceError` with every problem."""
    c = Checker(where)
    top = c.keys("", data, required=("task", "max_seq_len", "encoder", "decoder", "latency"),
                 optional=("name", "head_dim", "positions", "vocab_size", "tokenizer"))  # fmt: skip
    name = top.get("name", Path(where).stem)
    if not isinstance(name, str) or not name:
        c.error("name", f"{shown(name)} is not a non-empty string")
    vocab = c.pos_int("vocab_size", top["vocab_size"]) if "vocab_size" in top else None
    tokenizer = parse_tokenizer(c, top.get("tokenizer", "bytes"), VOCAB_SIZE, True, TASK)
    if tokenizer is not None and tokenizer.searched:
        c.error("tokenizer.bpe", "a seq2seq space reads one joint vocabulary (give one size: {bpe: 8192}); searching "
                                 "the vocabulary is for causal-lm spaces")
        tokenizer = None
    if tokenizer is not None and tokenizer.bpe:
        vocab = check_vocab_size(c, vocab, tokenizer, "vocab_size" in top)
    elif "vocab_size" not in top and tokenizer is not None:
        c.error("vocab_size", "missing")
    elif vocab is not None and vocab != VOCAB_SIZE:
        c.error("vocab_size", f"{vocab}: a seq2seq space is byte-level with PAD, BOS and EOS: give {VOCAB_SIZE}")
    max_seq = c.pos_int("max_seq_len", top["max_seq_len"]) if "max_seq_len" in top else None
    head_dim = c.pos_int("head_dim", top.get("head_dim", 64))
    positions = c.choice("positions", top.get("positions", "rope"), POSITIONS)
    if positions == "rope" and head_dim is not None and head_dim % 2:
        c.error("head_dim", f"{head_dim} must be even for rotary positions")
    sides, cross = {}, {}
    for side, form in SIDES.items():
        extra = ("cross_heads", "cross_layers") if side == "decoder" else ()
        sec = c.keys(side, top.get(side, {}), required=("embed_dim", "depth", "layers")) if side in top else {}
        embed = c.int_list(f"{side}.embed_dim", sec["embed_dim"]) if "embed_dim" in sec else None
        depth = c.int_list(f"{side}.depth", sec["depth"]) if "depth" in sec else None
        required = ("heads", "ffn_dim", "attention") + extra
        layers = c.keys(f"{side}.layers", sec["layers"], required=required) if "layers" in sec else {}
        heads = c.int_list(f"{side}.layers.heads", layers["heads"]) if "heads" in layers else None
        ffn = c.int_list(f"{side}.layers.ffn_dim", layers["ffn_dim"]) if "ffn_dim" in layers else None
        attention = _attention(c, f"{side}.layers.attention", layers.get("attention"), max_seq, heads, form)
        for k in extra:
            cross[k] = c.int_list(f"decoder.layers.{k}", layers[k]) if k in layers else None
        if None not in (embed, depth, heads, ffn, attention, max_seq, head_dim, positions):
            sides[side] = Space(f"{name}.{side}", TASK, vocab or VOCAB_SIZE, max_seq, head_dim, positions, embed, depth,
                                heads, ffn, attention, (), source, form)  # fmt: skip
    if cross.get("cross_layers"):
        bad = [k for k in cross["cross_layers"] if k not in CROSS_LAYERS]
        if bad:
            c.error("decoder.layers.cross_layers", f"{', '.join(map(str, bad))}: HAT's choices are the last "
                    f"{', '.join(map(str, CROSS_LAYERS))} encoder layers")  # fmt: skip
        elif "encoder" in sides and max(cross["cross_layers"]) > min(sides["encoder"].depth):
            c.error("decoder.layers.cross_layers", f"{max(cross['cross_layers'])} encoder layers, but the shallowest "
                    f"encoder has {min(sides['encoder'].depth)} (encoder.depth)")  # fmt: skip
    workloads = _translate_workloads(c, top["latency"], max_seq) if "latency" in top else []
    if c.errors:
        raise SpaceError(c.errors)
    return Seq2SeqSpace(name, vocab, max_seq, head_dim, positions, sides["encoder"], sides["decoder"],
                        cross["cross_heads"], cross["cross_layers"], tuple(workloads), source, tokenizer=tokenizer)  # fmt: skip


def _attention(c: Checker, path: str, raw: Any, max_seq: int | None, heads, form: str) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        c.error(path, f"expected a non-empty list of attention types, got {shown(raw)}")
        return None
    specs = []
    for i, a in enumerate(raw):
        try:
            spec = parse_attention(a)
        except ValueError as e:
            c.error(f"{path}[{i}]", str(e))
            continue
        for problem in spec_problems(spec, max_seq, heads or ()) if max_seq is not None else ():
            c.error(f"{path}[{i}]", problem)
        if not has_form(spec, form):
            c.error(f"{path}[{i}]", f"{spec} has no {form} form, which the {path.split('.')[0]}'s self-attention needs")
        specs.append(str(spec))
    return c.unique(path, tuple(specs)) if len(specs) == len(raw) else None


def _translate_workloads(c: Checker, lat: Any, max_seq: int | None) -> list[TranslateWorkload]:
    """The ``latency:`` section of a seq2seq space: named ``translate`` workloads (source, steps, beam)."""
    if not isinstance(lat, dict) or not lat:
        c.error("latency", f"expected a mapping of named workloads, e.g. {{translate: {{source: 30, steps: 30, beam: 5}}}}, "
                           f"got {shown(lat)}")  # fmt: skip
        return []
    out = []
    for wname, wdata in lat.items():
        path = f"latency.{wname}"
        named = wname if wname in (*WORKLOAD_KINDS, TRANSLATE) else None
        kind = (wdata.get("kind") if isinstance(wdata, dict) else None) or named
        if kind != TRANSLATE:
            other = f"a {with_form('causal')} workload" if kind in WORKLOAD_KINDS else "give kind: translate"
            c.error(path, f"a seq2seq space is timed with translate workloads (source, steps, beam), not {kind or 'this'} "
                          f"({other})")
            continue
        w = c.keys(path, wdata, required=("source", "steps", "beam"), optional=("kind",))
        vals = {k: c.pos_int(f"{path}.{k}", w[k]) for k in ("source", "steps", "beam") if k in w}
        for k in ("source", "steps"):
            if vals.get(k) is not None and max_seq is not None and vals[k] + (k == "steps") > max_seq:
                c.error(f"{path}.{k}", f"{vals[k]} does not fit max_seq_len {max_seq}"
                        + (" (the decoder's BOS takes one position)" if k == "steps" else ""))
        if len(vals) == 3 and None not in vals.values():
            out.append(TranslateWorkload(str(wname), vals["source"], vals["steps"], vals["beam"]))
    return out


def describe_seq2seq(space: Seq2SeqSpace) -> str:
    lines = [
        f"space {space.name}  ({space.source}, hash {space.hash})",
        f"  task          seq2seq, vocab {space.vocab_size} ("
        + (f"a joint {space.tokenizer}: PAD, BOS, EOS, then merges" if space.tokenizer.bpe else "bytes + PAD, BOS, EOS")
        + f"), max_seq_len {space.max_seq_len}, "
        f"head_dim {space.head_dim}, positions {space.positions}",
    ]
    for side in ("encoder", "decoder"):
        s: Space = getattr(space, side)
        lines += [
            f"  {side:<13} embed_dim {', '.join(map(str, s.embed_dim))}; depth {', '.join(map(str, s.depth))}",
            f"    per layer   heads {', '.join(map(str, s.heads))}; ffn_dim {', '.join(map(str, s.ffn_dim))}; "
            f"self-attention {', '.join(s.attention)}",
        ]
    lines.append(f"    cross       heads {', '.join(map(str, space.cross_heads))}; attends to the last "
                 f"{', '.join(map(str, space.cross_layers))} encoder layer(s)")  # fmt: skip
    lines += [f"  latency       {w}" for w in space.workloads]
    lines.append(f"  subnets       ~10^{math.log10(space.size()):.1f}")
    return "\n".join(lines)

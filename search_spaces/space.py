"""Search spaces and subnets.

A :class:`Space` is loaded from YAML (see ``tiny.yaml`` for the annotated format)
and validated as a whole: :func:`load_space` reports every problem at once, each
naming the file, the field path, the value and what is allowed.

A :class:`Subnet` is a small frozen value: embedding width, depth, and per-layer
heads / FFN width / attention type (tuples of length ``depth``).  It knows nothing
of the space it came from; ``space.check(subnet)`` says whether it belongs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import yaml

from . import tasks as registry
from .attention import FORMS, AttentionSpec, has_form, parse_attention, spec_problems, types
from .errors import SpaceError, SubnetError, UserError, shown
from .yamlio import load_yaml, read_text

SPACES_DIR = Path(__file__).resolve().parent
POSITIONS = ("learned", "rope")


# --------------------------------------------------------------------------- subnet


@dataclass(frozen=True)
class LayerChoice:
    """What one layer of a subnet runs: ``heads`` x head_dim attention width, FFN width, attention type.

    ``attention`` is the spelling (what files and shape keys hold); ``attention_spec`` the parsed type that models
    and cost functions read.  A subnet's or space's layers come with the spec they parsed once (:meth:`parsed`); a
    layer built from a spelling alone parses it on first use, once."""

    heads: int
    ffn_dim: int
    attention: str

    @classmethod
    def parsed(cls, heads: int, ffn_dim: int, attention: str, spec: AttentionSpec) -> "LayerChoice":
        """The layer of ``attention`` whose parse ``spec`` the caller holds (the spec is not a field: a config's
        ``asdict`` and the shape keys made of it stay as they were)."""
        layer = cls(heads, ffn_dim, attention)
        layer.__dict__["attention_spec"] = spec  # the cached_property's value
        return layer

    @cached_property
    def attention_spec(self) -> AttentionSpec:
        return parse_attention(self.attention)


class SubnetFile:
    """What every subnet value (the one-stack :class:`Subnet`, a task's own subnet type) shares: JSON and YAML
    forms, a stable key, loading from a file.  A subclass gives ``to_dict`` and ``from_dict(data, where)``."""

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str):
        return cls.from_dict(json.loads(text))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)

    @classmethod
    def from_yaml(cls, text: str, where: str = "subnet"):
        data = load_yaml(text, where, SubnetError)
        return cls.from_dict(data, where)

    @classmethod
    def load(cls, path: str | Path):
        path = Path(path)
        text = read_text(path, "subnet file", SubnetError)
        if path.suffix == ".json":
            try:
                return cls.from_dict(json.loads(text), path.name)
            except json.JSONDecodeError as e:
                raise SubnetError(f"{path.name}: not valid JSON: {e}") from None
        return cls.from_yaml(text, path.name)

    @property
    def key(self) -> str:
        """A stable 16-hex-digit identifier (same subnet, same key, in every process)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Subnet(SubnetFile):
    """One architecture. Per-layer tuples have exactly ``depth`` entries."""

    embed_dim: int
    depth: int
    heads: tuple[int, ...]
    ffn_dim: tuple[int, ...]
    attention: tuple[str, ...]
    # the vocabulary size of a space that searches it (tokenizer: {bpe: [...]}); None: the space's one (keyword-only: a
    # subclass, the image task's subnet, adds fields of its own)
    vocab: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        # Structural checks only (types and lengths); membership is Space.check's job.
        for name in ("embed_dim", "depth"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise SubnetError(f"subnet.{name}: {shown(value)} is not a positive integer")
        if self.vocab is not None and (not is_int(self.vocab) or self.vocab < 1):
            raise SubnetError(f"subnet.vocab: {shown(self.vocab)} is not a positive integer")
        for name in ("heads", "ffn_dim", "attention"):
            value = getattr(self, name)
            if not isinstance(value, tuple):
                raise SubnetError(f"subnet.{name}: expected a tuple, got {type(value).__name__}")
            if len(value) != self.depth:
                raise SubnetError(f"subnet.{name}: has {len(value)} entries but depth is {self.depth}")
        for name in ("heads", "ffn_dim"):
            for i, v in enumerate(getattr(self, name)):
                if not is_int(v) or v < 1:
                    raise SubnetError(f"subnet.{name}[{i}]: {shown(v)} is not a positive integer")
        specs = []
        for i, a in enumerate(self.attention):
            try:
                specs.append(parse_attention(a))
            except ValueError as e:
                raise SubnetError(f"subnet.attention[{i}]: {e}") from None
            if str(specs[-1]) != a:
                raise SubnetError(f"subnet.attention[{i}]: write {str(specs[-1])!r}, not {shown(a)}")
        self.__dict__["attention_specs"] = tuple(specs)  # the cached_property's value, from the one parse

    @cached_property
    def attention_specs(self) -> tuple[AttentionSpec, ...]:
        """Each layer's attention type parsed (``__post_init__`` fills it as it checks the spellings)."""
        return tuple(parse_attention(a) for a in self.attention)

    @property
    def layers(self) -> tuple[LayerChoice, ...]:
        return tuple(LayerChoice.parsed(h, f, a, s)
                     for h, f, a, s in zip(self.heads, self.ffn_dim, self.attention, self.attention_specs))

    @property
    def stacks(self) -> tuple["Subnet", ...]:
        """The stacks of blocks this architecture is made of: one (an encoder-decoder has two)."""
        return (self,)

    # -- serialisation ------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out = {
            "embed_dim": self.embed_dim,
            "depth": self.depth,
            "heads": list(self.heads),
            "ffn_dim": list(self.ffn_dim),
            "attention": list(self.attention),
        }
        if self.vocab is not None:  # only a space that searches the vocabulary has it: every other key stays as it was
            out["vocab"] = self.vocab
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "subnet") -> "Subnet":
        if not isinstance(data, dict):
            raise SubnetError(f"{where}: expected a mapping with keys embed_dim, depth, heads, ffn_dim, attention")
        if set(data) == {"encoder", "decoder"}:
            raise SubnetError(f"{where}: an encoder-decoder's subnet (keys encoder and decoder), not one of this decoder-only "
                              "space (keys embed_dim, depth, heads, ffn_dim, attention): the subnet is of another space")
        expected = {"embed_dim", "depth", "heads", "ffn_dim", "attention"}
        unknown = sorted(set(map(str, data)) - expected - {"vocab"})
        missing = sorted(expected - set(data))
        problems = [f"{where}: unknown key {shown(k)} (allowed: {', '.join(sorted(expected | {'vocab'}))})" for k in unknown]
        problems += [f"{where}: missing key {shown(k)}" for k in missing]
        if problems:
            raise SubnetError("\n".join(problems))
        lists = {}
        for k in ("heads", "ffn_dim", "attention"):
            if not isinstance(data[k], (list, tuple)):
                raise SubnetError(f"{where}.{k}: expected a list, got {shown(data[k])}")
            lists[k] = tuple(data[k])
        try:
            return cls(embed_dim=data["embed_dim"], depth=data["depth"], **lists, vocab=data.get("vocab"))
        except SubnetError as e:
            raise SubnetError(str(e).replace("subnet", where, 1)) from None

    def __str__(self) -> str:
        """Compact form, runs of equal layers folded: ``d128 L4 [2x 4h/512/softmax, 1h/128/linear, ...]``."""
        runs: list[list] = []
        for layer in zip(self.heads, self.ffn_dim, self.attention):
            if runs and runs[-1][1] == layer:
                runs[-1][0] += 1
            else:
                runs.append([1, layer])
        text = ", ".join(f"{n}x " * (n > 1) + f"{h}h/{f}/{a}" for n, (h, f, a) in runs)
        vocab = f" V{self.vocab}" if self.vocab is not None else ""
        return f"d{self.embed_dim} L{self.depth}{vocab} [{text}]"


# --------------------------------------------------------------------------- tokenizer


BYTES = 256  # the byte ids 0-255: every vocabulary starts with them
MAX_VOCAB = 1 << 16  # token ids are stored as uint16


@dataclass(frozen=True)
class TokenizerSpec:
    """What a space's models read: ``bytes`` (the ids 0-255 are the bytes; the default) or byte-level BPE
    vocabularies of ``sizes`` (``tokenizer: {bpe: 4096}``, or several, searched: ``{bpe: [bytes, 1024, 4096]}``).

    A BPE of size ``k`` is the bytes (and the task's specials, ``base`` ids in all) plus the first ``k - base``
    merges of one BPE trained at the largest size: the vocabularies are nested, so a smaller one's embedding
    rows are the leading rows of a larger one's (``supernet.tokenizer``).  ``bytes`` among the sizes is the
    vocabulary of no merge (size ``base``)."""

    kind: str = "bytes"  # "bytes" or "bpe"
    sizes: tuple[int, ...] = ()  # bpe: the vocabulary sizes, ascending (``base`` where ``bytes`` is listed)
    base: int = BYTES  # ids before the first merge: the bytes and the task's special ids

    @property
    def bpe(self) -> bool:
        return self.kind == "bpe"

    @property
    def searched(self) -> bool:
        """Whether subnets choose among several vocabularies (a ``vocab`` gene)."""
        return len(self.sizes) > 1

    def byte_vocab(self, vocab_size: int | None) -> int | None:
        """The size of the byte vocabulary among those a space reads (one token a byte): its ``vocab_size`` when it
        reads bytes, ``base`` when ``bytes`` is among its BPE sizes, else None."""
        if not self.bpe:
            return vocab_size
        return self.base if self.base in self.sizes else None

    def to_dict(self) -> Any:
        """The YAML form (``bytes``, ``{bpe: 4096}``, ``{bpe: [bytes, 1024]}``)."""
        if not self.bpe:
            return "bytes"
        sizes = ["bytes" if k == self.base else k for k in self.sizes]
        return {"bpe": sizes[0] if len(sizes) == 1 else sizes}

    def __str__(self) -> str:
        if not self.bpe:
            return "bytes"
        return "byte-level BPE " + ", ".join("bytes" if k == self.base else f"{k:,}" for k in self.sizes)


def parse_tokenizer(c: "Checker", raw: Any, base: int, subword: bool, task: str | None) -> TokenizerSpec | None:
    """The ``tokenizer:`` field: ``bytes`` or ``{bpe: SIZE or [SIZE or bytes, ...]}``, each size above ``base`` (the
    bytes and the task's special ids) and at most :data:`MAX_VOCAB`; ``subword``: whether the task reads BPE."""
    if raw == "bytes":
        return TokenizerSpec(base=base)
    example = "bytes, {bpe: 4096} or {bpe: [bytes, 1024, 4096]}"
    if not isinstance(raw, dict) or set(raw) != {"bpe"}:
        c.error("tokenizer", f"{shown(raw)} is not a tokenizer (expected {example})")
        return None
    if not subword:
        c.error("tokenizer", f"task {task} reads bytes only (a subword vocabulary is for causal-lm and seq2seq spaces)")
        return None
    values = raw["bpe"] if isinstance(raw["bpe"], list) else [raw["bpe"]]
    if not values:
        c.error("tokenizer.bpe", f"expected a size or a non-empty list of sizes ({example})")
        return None
    sizes = []
    for i, v in enumerate(values):
        path = "tokenizer.bpe" if not isinstance(raw["bpe"], list) else f"tokenizer.bpe[{i}]"
        if v == "bytes":
            sizes.append(base)
        elif not is_int(v) or not base < v <= MAX_VOCAB:
            c.error(path, f"{shown(v)} is not a vocabulary size: expected bytes or an integer in {base + 1}..{MAX_VOCAB} "
                          f"(the {base} ids of the bytes{' and specials' if base > BYTES else ''} come first)")
        else:
            sizes.append(int(v))
    if len(sizes) != len(values) or c.unique("tokenizer.bpe", tuple(sizes)) is None:
        return None
    return TokenizerSpec("bpe", tuple(sorted(sizes)), base)


def tokenizer_spec(raw: Any, base: int = BYTES, where: str = "tokenizer") -> TokenizerSpec:
    """A ``tokenizer:`` value (the YAML form, as a run's meta records it) as a spec; :class:`SpaceError` when it is not one."""
    c = Checker(where)
    spec = parse_tokenizer(c, raw, base, True, None)
    if c.errors or spec is None:
        raise SpaceError(c.errors)
    return spec


def check_vocab_size(c: "Checker", vocab: int | None, spec: TokenizerSpec | None, given: bool) -> int | None:
    """A BPE space's ``vocab_size`` (the embedding's rows): the largest vocabulary when not given; refused when smaller."""
    if spec is None or not spec.bpe:
        return vocab
    largest = spec.sizes[-1]
    if not given:
        return largest
    if vocab is not None and vocab < largest:
        c.error("vocab_size", f"{vocab} is smaller than the largest vocabulary of tokenizer.bpe ({largest}): the embedding "
                              "holds every vocabulary's rows (leave vocab_size out, or give at least that)")
        return None
    return vocab


# --------------------------------------------------------------------------- space


WORKLOAD_KINDS = ("prefill", "decode")
_WORKLOAD_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class Workload:
    """What latency is measured on.

    ``prefill``: one forward pass over ``batch_size`` x ``seq_len`` tokens.  ``decode``: one new
    token per sequence (``batch_size`` x 1) with ``context`` tokens already in the cache (the time
    per generated token at that context).

    A prefill may be stated in **bytes of text** (``bytes: 1024`` in the YAML, ``text_bytes``) rather than tokens, so
    that a budget means the same text whatever vocabulary a model reads: a model of vocabulary ``V`` then runs
    ``ceil(bytes / bytes_per_token(V))`` tokens (:meth:`at_vocab`), the tokenizer's bytes per token measured on the
    validation split (:meth:`with_bytes_per_token`, from the supernet's run: ``supernet.checkpoint``).  ``seq_len`` is
    then the bytes' count, which is what a byte-level model runs; ``vocab_tokens`` holds the tokens per vocabulary
    known so far (the byte vocabulary's from the start).
    """

    name: str
    batch_size: int
    seq_len: int = 0  # prefill: tokens per forward pass (0 for decode)
    kind: str = "prefill"
    context: int = 0  # decode: tokens already in the cache (0 for prefill)
    text_bytes: int = 0  # a prefill stated in bytes of text (0: in tokens)
    vocab_tokens: tuple[tuple[int, int], ...] = ()  # a text prefill's tokens per vocabulary, ascending by vocabulary

    def at_vocab(self, vocab: int) -> "Workload":
        """The workload a model of vocabulary ``vocab`` runs: a prefill stated in bytes of text as that vocabulary's
        tokens for those bytes (the same text at every vocabulary); any other workload is itself."""
        if not self.text_bytes:
            return self
        tokens = dict(self.vocab_tokens)
        if vocab not in tokens:
            raise UserError(f"workload {self.name!r} is stated in bytes of text ({self.text_bytes:,}): its tokens at "
                            f"vocabulary {vocab:,} need that tokenizer's bytes per token, which a supernet trained on the "
                            "corpus measured (time and predict with its checkpoint's space, not the YAML's)")
        return replace(self, seq_len=tokens[vocab])

    def with_bytes_per_token(self, rates: Mapping[int, float], max_seq_len: int) -> "Workload":
        """A text prefill with each vocabulary's tokens for its bytes (``rates``: vocabulary -> measured bytes per
        token); a workload in tokens is returned as it is.  Refused when a vocabulary needs more than ``max_seq_len``."""
        if not self.text_bytes:
            return self
        tokens = dict(self.vocab_tokens)
        for vocab, rate in rates.items():
            n = max(1, math.ceil(self.text_bytes / float(rate)))
            if n > max_seq_len:
                raise UserError(f"workload {self.name!r}: {self.text_bytes:,} bytes of text are {n:,} tokens at vocabulary "
                                f"{int(vocab):,} ({float(rate):.2f} bytes per token), beyond max_seq_len {max_seq_len:,}")
            tokens[int(vocab)] = n
        return replace(self, vocab_tokens=tuple(sorted(tokens.items())))

    def __post_init__(self) -> None:
        if self.kind not in WORKLOAD_KINDS:
            raise UserError(f"workload {self.name!r}: kind {shown(self.kind)} is not one of {', '.join(WORKLOAD_KINDS)}")
        ok = self.seq_len >= 1 and self.context == 0 if self.kind == "prefill" else self.context >= 1 and self.seq_len == 0
        if not ok or self.batch_size < 1:
            raise UserError(f"workload {self.name!r}: {self.kind} takes batch_size >= 1 and "
                            + ("seq_len >= 1" if self.kind == "prefill" else "context >= 1") + f", got {self.to_dict()}")

    @property
    def tokens(self) -> int:
        """Tokens a timed call processes per sequence: ``seq_len`` (prefill) or 1 (decode)."""
        return self.seq_len if self.kind == "prefill" else 1

    @property
    def positions(self) -> int:
        """Positions the model must hold: ``seq_len`` (prefill) or ``context + 1`` (decode)."""
        return self.seq_len if self.kind == "prefill" else self.context + 1

    @property
    def shape(self) -> str:
        """``1x256`` (prefill), ``1x1024 bytes`` (a prefill in bytes of text) or ``1x1 at context 255`` (decode)."""
        if self.text_bytes:
            return f"{self.batch_size}x{self.text_bytes} bytes"
        if self.kind == "prefill":
            return f"{self.batch_size}x{self.seq_len}"
        return f"{self.batch_size}x1 at context {self.context}"

    @property
    def label(self) -> str:
        """Compact and unique per shape: ``prefill:1x256``, ``prefill:1x1024B`` (bytes of text), ``decode:1x1@255`` (a
        timing table's rows carry it; the same at every vocabulary)."""
        if self.text_bytes:
            return f"{self.name}:{self.batch_size}x{self.text_bytes}B"
        return (
            f"{self.name}:{self.batch_size}x{self.seq_len}"
            if self.kind == "prefill"
            else f"{self.name}:{self.batch_size}x1@{self.context}"
        )

    def __str__(self) -> str:
        return f"{self.name} ({self.kind} {self.shape})"

    def to_dict(self) -> dict[str, Any]:
        """The YAML form (prefill keeps its historical keys, so a space's hash does not change)."""
        if self.kind == "prefill":
            size = {"bytes": self.text_bytes} if self.text_bytes else {"seq_len": self.seq_len}
            out = {"batch_size": self.batch_size, **size}
            return out if self.name == "prefill" else {"kind": "prefill", **out}
        return {"kind": "decode", "batch_size": self.batch_size, "context": self.context}

    def record(self) -> dict[str, Any]:
        """What files store: name, kind and shape (read back by :meth:`from_record`); a text prefill adds its bytes and
        its tokens per vocabulary."""
        text = {"bytes": self.text_bytes, "tokens": {str(v): n for v, n in self.vocab_tokens}} if self.text_bytes else {}
        return {
            "name": self.name,
            "kind": self.kind,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "context": self.context,
            **text,
        }

    @classmethod
    def from_record(cls, data: Any, where: str = "workload") -> "Workload":
        """Inverse of :meth:`record`; a record without ``kind`` (written before decode existed) is a prefill; a
        record of a kind a task adds is read back by that task (:func:`search_spaces.tasks.owning`)."""
        owner = registry.owning(data.get("kind")) if isinstance(data, dict) and isinstance(data.get("kind"), str) else None
        if owner is not None:
            return owner.workload_from_record(data, where)
        if not isinstance(data, dict) or "name" not in data or "batch_size" not in data:
            raise UserError(f"{where}: not a workload record (expected name, kind, batch_size, seq_len / context), "
                            f"got {shown(data)}")
        known = {"name", "kind", "batch_size", "seq_len", "context"}
        text = {}
        if "bytes" in data:
            tokens = data.get("tokens") or {}
            if not isinstance(tokens, dict) or not all(str(k).isdigit() and isinstance(n, int) for k, n in tokens.items()):
                raise UserError(f"{where}: tokens: expected vocabulary -> tokens, got {shown(tokens)}")
            text = {"text_bytes": data["bytes"], "vocab_tokens": tuple(sorted((int(k), n) for k, n in tokens.items()))}
        try:
            return cls(**{k: v for k, v in data.items() if k in known}, **text)
        except TypeError as e:
            raise UserError(f"{where}: not a workload record: {e}") from None


class SpaceIdentity:
    """What every space (the one-stack :class:`Space`, a task's own space type) shares: its hashes, the
    membership check and the workload lookup.  A subclass gives ``to_dict``, ``problems``, ``name``, ``source``,
    ``workloads`` and ``subnet_type`` (its subnet class)."""

    subnet_type: type = SubnetFile

    def workload(self, name: str | None = None, flag: str = "--workload"):
        """The workload ``name`` of the latency section (default: the first listed)."""
        if name is None:
            return self.workloads[0]
        for w in self.workloads:
            if w.name == name:
                return w
        raise UserError(
            f"{flag}: space {self.name!r} has no latency workload {shown(name)} (it has: {', '.join(map(str, self.workloads))})"
        )

    def __contains__(self, subnet) -> bool:
        return not self.problems(subnet)

    def check(self, subnet):
        """Return ``subnet`` if it belongs to this space, else raise :class:`SubnetError` listing why."""
        if not isinstance(subnet, self.subnet_type):
            raise SubnetError(f"expected a {self.subnet_type.__name__}, got {type(subnet).__name__}")
        problems = self.problems(subnet)
        if problems:
            raise SubnetError(f"subnet is not in space {self.name!r} ({self.source}):\n  " + "\n  ".join(problems))
        return subnet

    @property
    def hash(self) -> str:
        """Stable 16-hex-digit hash of everything that defines the space (not its file name or comments)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]

    @property
    def arch_hash(self) -> str:
        """Hash of what defines the models (everything but the latency workloads): a supernet and a
        latency predictor agree on their subnets when this agrees, whatever workloads each file lists."""
        arch = {k: v for k, v in self.to_dict().items() if k != "latency"}
        return hashlib.sha256(json.dumps(arch, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Space(SpaceIdentity):
    """A search space: the choices of every dimension plus the fixed model facts."""

    name: str
    task: str
    vocab_size: int
    max_seq_len: int
    head_dim: int
    positions: str
    embed_dim: tuple[int, ...]
    depth: tuple[int, ...]
    heads: tuple[int, ...]
    ffn_dim: tuple[int, ...]
    attention: tuple[str, ...]
    workloads: tuple[Workload, ...]
    source: str = field(default="<memory>", compare=False)
    form: str = field(default="", compare=False)  # the attention form; "" = the task's (search_spaces.tasks)
    memory: int = 0  # a causal model's memory: tokens of the previous segment every layer attends to (0: none)
    tokenizer: TokenizerSpec = field(default=TokenizerSpec(), kw_only=True)  # bytes (the default) or byte-level BPE

    subnet_type = Subnet  # (a class attribute, not a field: SpaceIdentity.check)

    # -- vocabulary ---------------------------------------------------------------

    @property
    def vocabs(self) -> tuple[int, ...]:
        """The vocabulary sizes a subnet may read, ascending: ``(vocab_size,)`` for bytes, the BPE sizes otherwise."""
        return self.tokenizer.sizes if self.tokenizer.bpe else (self.vocab_size,)

    def vocab_of(self, subnet: Subnet) -> int:
        """The vocabulary ``subnet`` reads (its embedding and output rows): its gene, or the space's one."""
        return subnet.vocab if subnet.vocab is not None else self.vocabs[-1]

    def with_bytes_per_token(self, rates: Mapping[int, float]) -> "Space":
        """This space with its prefills stated in bytes of text knowing each vocabulary's tokens (``rates``: the
        tokenizer's measured bytes per token, vocabulary -> bytes; a supernet's ``meta.vocabulary``).  Nothing else
        changes (the hashes neither: they do not read a workload's tokens)."""
        return replace(self, workloads=tuple(w.with_bytes_per_token(rates, self.max_seq_len) for w in self.workloads))

    def _vocab_gene(self, value: int) -> int | None:
        """What a subnet stores of vocabulary ``value``: the size where the space searches it, else None."""
        return value if self.tokenizer.searched else None

    # -- shape facts --------------------------------------------------------------

    @cached_property
    def attention_specs(self) -> tuple[AttentionSpec, ...]:
        """The attention choices parsed, once per space (``attention`` keeps the spellings its file and hash hold)."""
        return tuple(parse_attention(a) for a in self.attention)

    @property
    def attention_form(self) -> str:
        """``causal`` (a query sees the keys before it: a decoder) or ``bidirectional`` (every key: an encoder)."""
        return self.form or registry.get(self.task).form

    @property
    def causal(self) -> bool:
        """Whether the model's attention is causal (a decoder) rather than bidirectional (an encoder)."""
        return self.attention_form == "causal"

    def require_one_stack(self, command: str) -> None:
        """The commands that run one stack of blocks call this; a space of another shape (a task's own space
        type) refuses in one line the commands it does not run yet."""

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    @property
    def max_embed_dim(self) -> int:
        return max(self.embed_dim)

    @property
    def max_heads(self) -> int:
        return max(self.heads)

    @property
    def max_ffn_dim(self) -> int:
        return max(self.ffn_dim)

    # -- members ------------------------------------------------------------------

    def largest(self, attention: str | None = None) -> Subnet:
        """Widest and deepest subnet; every layer uses ``attention`` (default: the first listed type)."""
        d, a = self.max_depth, self._type_or_first(attention)
        return Subnet(self.max_embed_dim, d, (self.max_heads,) * d, (self.max_ffn_dim,) * d, (a,) * d,
                      vocab=self._vocab_gene(self.vocabs[-1]))

    def smallest(self, attention: str | None = None) -> Subnet:
        """Narrowest and shallowest subnet; every layer uses ``attention`` (default: the first listed type)."""
        d, a = min(self.depth), self._type_or_first(attention)
        return Subnet(min(self.embed_dim), d, (min(self.heads),) * d, (min(self.ffn_dim),) * d, (a,) * d,
                      vocab=self._vocab_gene(self.vocabs[0]))

    def _type_or_first(self, attention: str | None) -> str:
        assert attention is None or attention in self.attention, (attention, self.attention)
        return self.attention[0] if attention is None else attention

    def uniform(self) -> list[Subnet]:
        """Every hand-scaled Transformer of the space: all layers the same heads, FFN width and attention type."""
        grid = itertools.product(self.embed_dim, self.depth, self.heads, self.ffn_dim, self.attention, self.vocabs)
        return [Subnet(e, d, (h,) * d, (f,) * d, (a,) * d, vocab=self._vocab_gene(v)) for e, d, h, f, a, v in grid]

    def sample(self, rng: np.random.Generator) -> Subnet:
        """Draw each choice uniformly and independently (depth first, then every layer)."""
        depth = int(rng.choice(self.depth))
        return Subnet(
            embed_dim=int(rng.choice(self.embed_dim)),
            depth=depth,
            heads=tuple(int(x) for x in rng.choice(self.heads, size=depth)),
            ffn_dim=tuple(int(x) for x in rng.choice(self.ffn_dim, size=depth)),
            attention=tuple(str(self.attention[i]) for i in rng.integers(len(self.attention), size=depth)),
            # drawn last, and only where searched: a space of one vocabulary draws exactly what it drew before
            vocab=int(rng.choice(self.vocabs)) if self.tokenizer.searched else None,
        )

    def lightest(self) -> list[Subnet]:
        """The smallest choice of every dimension, once with each attention type on every layer (the search's first
        candidates for a tight budget: which type is the lightest depends on the device)."""
        s = self.smallest()
        return [Subnet(s.embed_dim, s.depth, s.heads, s.ffn_dim, (a,) * s.depth, vocab=s.vocab) for a in self.attention]

    # -- genes: what the search's operators and its storage ask of a space ---------

    def mutate(self, parent: Subnet, rng: np.random.Generator, prob: float) -> Subnet:
        """Redraw every gene (embed_dim, depth, each layer's heads / FFN / attention) with probability ``prob``;
        layers a deeper child gains are drawn fresh."""
        embed = _pick(rng, self.embed_dim) if rng.random() < prob else parent.embed_dim
        depth = _pick(rng, self.depth) if rng.random() < prob else parent.depth
        genes = {"heads": self.heads, "ffn_dim": self.ffn_dim, "attention": self.attention}
        layers = {name: [] for name in genes}
        for i in range(depth):
            for name, choices in genes.items():
                inherited = i < parent.depth and rng.random() >= prob
                layers[name].append(getattr(parent, name)[i] if inherited else _pick(rng, choices))
        vocab = parent.vocab
        if self.tokenizer.searched and rng.random() < prob:
            vocab = int(_pick(rng, self.vocabs))
        return Subnet(int(embed), int(depth), *(tuple(layers[n]) for n in ("heads", "ffn_dim", "attention")), vocab=vocab)

    def crossover(self, a: Subnet, b: Subnet, rng: np.random.Generator) -> Subnet:
        """Each gene from ``a`` or ``b`` with equal chance; layers only one parent has come from it."""
        parents = (a, b)
        embed = parents[int(rng.integers(2))].embed_dim
        depth = parents[int(rng.integers(2))].depth
        layers = {name: [] for name in ("heads", "ffn_dim", "attention")}
        for i in range(depth):
            for name in layers:
                have = [getattr(p, name)[i] for p in parents if i < p.depth]
                layers[name].append(have[int(rng.integers(len(have)))])
        vocab = parents[int(rng.integers(2))].vocab if self.tokenizer.searched else None
        return Subnet(int(embed), int(depth), *(tuple(layers[n]) for n in ("heads", "ffn_dim", "attention")), vocab=vocab)

    def genes(self, subnet: Subnet) -> dict[str, tuple[Any, tuple]]:
        """The subnet's genes by name, each ``(value, choices)``: a search's storage keeps them as categorical
        parameters (``embed_dim``, ``depth``, then ``l{i}.heads``, ``l{i}.ffn_dim``, ``l{i}.attention`` per layer)."""
        out: dict[str, tuple[Any, tuple]] = {"embed_dim": (subnet.embed_dim, self.embed_dim), "depth": (subnet.depth, self.depth)}
        for i, layer in enumerate(subnet.layers):
            for name, value, choices in (("heads", layer.heads, self.heads), ("ffn_dim", layer.ffn_dim, self.ffn_dim),
                                         ("attention", layer.attention, self.attention)):
                out[f"l{i}.{name}"] = (value, choices)
        if self.tokenizer.searched:
            out["vocab"] = (subnet.vocab, self.vocabs)
        return out

    def problems(self, subnet: Subnet) -> list[str]:
        """Every reason ``subnet`` is not in this space (empty when it is)."""
        out = []

        def check(path: str, value: object, allowed: tuple) -> None:
            if value not in allowed:
                out.append(f"{path}: {shown(value)} is not one of {', '.join(map(str, allowed))}")

        check("embed_dim", subnet.embed_dim, self.embed_dim)
        check("depth", subnet.depth, self.depth)
        for i, layer in enumerate(subnet.layers):
            check(f"heads[{i}]", layer.heads, self.heads)
            check(f"ffn_dim[{i}]", layer.ffn_dim, self.ffn_dim)
            check(f"attention[{i}]", layer.attention, self.attention)
        if self.tokenizer.searched:
            check("vocab", subnet.vocab, self.vocabs)
        elif subnet.vocab is not None:
            out.append(f"vocab: {shown(subnet.vocab)} given, but space {self.name!r} does not search the vocabulary "
                       f"(it reads {self.tokenizer})")
        return out

    def size(self) -> int:
        """Number of distinct subnets."""
        per_layer = len(self.heads) * len(self.ffn_dim) * len(self.attention)
        return len(self.vocabs) * len(self.embed_dim) * sum(per_layer**d for d in self.depth)

    def enumerate_layers(self) -> Iterator[LayerChoice]:
        for h in self.heads:
            for f in self.ffn_dim:
                for a, spec in zip(self.attention, self.attention_specs):
                    yield LayerChoice.parsed(h, f, a, spec)

    # -- features -----------------------------------------------------------------

    def feature_names(self) -> list[str]:
        names = ["embed_dim", "depth"]
        for i in range(self.max_depth):
            names += [f"l{i}.active", f"l{i}.heads", f"l{i}.ffn_dim"]
            names += [f"l{i}.attn={a}" for a in self.attention]
        return names + (["vocab"] if self.tokenizer.searched else [])

    def encode(self, subnet: Subnet) -> np.ndarray:
        """Fixed-length float vector: embed_dim, depth, then per layer (active, heads, ffn_dim, one-hot type), then the
        vocabulary size where the space searches it."""
        self.check(subnet)
        n_att = len(self.attention)
        vec = np.zeros(2 + self.max_depth * (3 + n_att) + self.tokenizer.searched, dtype=np.float64)
        if self.tokenizer.searched:
            vec[-1] = subnet.vocab
        vec[0], vec[1] = subnet.embed_dim, subnet.depth
        for i, layer in enumerate(subnet.layers):
            base = 2 + i * (3 + n_att)
            vec[base : base + 3] = (1.0, layer.heads, layer.ffn_dim)
            vec[base + 3 + self.attention.index(layer.attention)] = 1.0
        return vec

    def decode(self, vec: np.ndarray) -> Subnet:
        """Inverse of :meth:`encode`."""
        vec = np.asarray(vec, dtype=np.float64)
        n_att = len(self.attention)
        n = 2 + self.max_depth * (3 + n_att) + self.tokenizer.searched
        if vec.shape != (n,):
            raise SubnetError(f"feature vector has shape {vec.shape}, space {self.name!r} expects ({n},)")
        depth = int(round(vec[1]))
        heads, ffn, att = [], [], []
        for i in range(depth):
            base = 2 + i * (3 + n_att)
            heads.append(int(round(vec[base + 1])))
            ffn.append(int(round(vec[base + 2])))
            att.append(self.attention[int(np.argmax(vec[base + 3 : base + 3 + n_att]))])
        vocab = int(round(vec[-1])) if self.tokenizer.searched else None
        return self.check(Subnet(int(round(vec[0])), depth, tuple(heads), tuple(ffn), tuple(att), vocab=vocab))

    # -- identity -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "task": self.task,
            "vocab_size": self.vocab_size,
            "max_seq_len": self.max_seq_len,
            "head_dim": self.head_dim,
            "positions": self.positions,
            "embed_dim": list(self.embed_dim),
            "depth": list(self.depth),
            "layers": {"heads": list(self.heads), "ffn_dim": list(self.ffn_dim), "attention": list(self.attention)},
            **({"memory": self.memory} if self.memory else {}),  # (absent without memory: hashes as before)
            "latency": {w.name: w.to_dict() for w in self.workloads},
            # only a subword space says it: the dict (and so the hash) of a byte space is what it was
            **({"tokenizer": self.tokenizer.to_dict()} if self.tokenizer.bpe else {}),
        }

    # hash, arch_hash, check, workload: SpaceIdentity


# --------------------------------------------------------------------------- loading


# Upper bounds of a space's sizes (the schema's): far above any model trained here, low enough that a typo
# (``embed_dim: [64, 1000000000]``) is refused at load instead of filling the memory or the disk later.
# Every refusal names the field, the value and the limit.
LIMITS = {
    "vocab_size": 1 << 20,
    "max_seq_len": 1 << 20,
    "head_dim": 1024,
    "embed_dim": 65536,
    "depth": 256,
    "layers.heads": 256,
    "layers.ffn_dim": 262144,
    "batch_size": 65536,
    "context": 1 << 20,
}


def _pick(rng: np.random.Generator, choices: tuple):
    return choices[int(rng.integers(len(choices)))]


def is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


class Checker:
    """Collects every error of one file, each as ``file: path: value: what is allowed``."""

    def __init__(self, where: str):
        self.where = where
        self.errors: list[str] = []

    def error(self, path: str, message: str) -> None:
        self.errors.append(f"{self.where}: {path}: {message}" if path else f"{self.where}: {message}")

    def keys(self, path: str, data: Any, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
        if not isinstance(data, dict):
            self.error(path, f"expected a mapping with keys {', '.join(required + optional)}, got {shown(data)}")
            return {}
        allowed = required + optional
        for k in data:
            if k not in allowed:
                name = k if isinstance(k, str) and len(k) <= 60 else shown(k)  # a key is quoted as a value is: cut
                self.error(f"{path}.{name}" if path else name, f"unknown key (allowed: {', '.join(allowed)})")
        for k in required:
            if k not in data:
                self.error(f"{path}.{k}" if path else k, "missing")
        return data

    def pos_int(self, path: str, value: Any) -> int | None:
        if not is_int(value) or value < 1:
            self.error(path, f"{shown(value)} is not a positive integer")
            return None
        field = re.sub(r"\[\d+\]$", "", path)
        limit = LIMITS.get(field if field in LIMITS else field.rsplit(".", 1)[-1])
        if limit is not None and value > limit:
            self.error(path, f"{shown(value)} is above the limit of {limit:,} for {field}")
            return None
        return int(value)

    def choice(self, path: str, value: Any, allowed: tuple[str, ...]) -> str | None:
        if value not in allowed:
            self.error(path, f"{shown(value)} is not one of {', '.join(allowed)}")
            return None
        return value

    def int_list(self, path: str, value: Any) -> tuple[int, ...] | None:
        if not isinstance(value, list) or not value:
            self.error(path, f"expected a non-empty list of positive integers, got {shown(value)}")
            return None
        out = [self.pos_int(f"{path}[{i}]", v) for i, v in enumerate(value)]
        if any(v is None for v in out):
            return None
        return self.unique(path, tuple(out))

    def unique(self, path: str, values: tuple) -> tuple | None:
        dupes = sorted({str(v) for v in values if values.count(v) > 1})
        if dupes:
            self.error(path, f"repeated choice(s) {', '.join(dupes)}")
            return None
        return values


def load_space(source: str | Path) -> Space:
    """Load and validate a space from a YAML path, or by name (``tiny``, ``base``) from the shipped ones."""
    path = resolve_space_path(source)
    text = read_text(path, "search space", SpaceError)
    return parse_space(text, where=path.name, source=str(path))


def resolve_space_path(source: str | Path) -> Path:
    path = Path(source)
    if path.exists() or path.suffix in (".yaml", ".yml") or "/" in str(source):
        return path
    shipped = SPACES_DIR / f"{source}.yaml"
    if shipped.exists():
        return shipped
    names = ", ".join(sorted(p.stem for p in SPACES_DIR.glob("*.yaml")))
    raise SpaceError([f"{source}: no such search-space file, and not a shipped space (shipped: {names})"])


def parse_space(text: str, where: str = "<string>", source: str = "<string>") -> Space:
    """Validate YAML text as a space; raise :class:`SpaceError` with every problem found.

    The file's ``task:`` names the task whose format it is (:mod:`search_spaces.tasks`): a one-stack model's
    (:func:`parse_stack`, most tasks), or a format of the task's own (an encoder-decoder's)."""
    data = load_yaml(text, where, SpaceError)
    task = data.get("task") if isinstance(data, dict) else None
    known = registry.tasks()
    if isinstance(task, str) and task in known:
        return known[task].parse_space(data, where, source)
    return parse_stack(data, where, source)  # no known task: every problem of the file at once, the task's among them


def parse_stack(data: Any, where: str, source: str, form: str | None = None) -> Space:
    """A one-stack space (YAML-loaded ``data``; ``tiny.yaml`` is annotated) whose model's attention has ``form``
    (``causal`` or ``bidirectional``: every type must have it); :class:`SpaceError` lists every problem."""
    assert form is None or form in FORMS, form
    c = Checker(where)
    top = c.keys(
        "",
        data,
        required=("task", "max_seq_len", "embed_dim", "depth", "layers", "latency"),
        optional=("name", "head_dim", "positions", "vocab_size", "tokenizer", "memory"),
    )
    if not top:
        raise SpaceError(c.errors)
    name = top.get("name", Path(where).stem)
    if not isinstance(name, str) or not name:
        c.error("name", f"{shown(name)} is not a non-empty string")
    task = c.choice("task", top.get("task"), tuple(registry.tasks())) if "task" in top else None
    vocab = c.pos_int("vocab_size", top["vocab_size"]) if "vocab_size" in top else None
    subword = task is not None and getattr(registry.get(task), "subword", False)
    tokenizer = parse_tokenizer(c, top.get("tokenizer", "bytes"), BYTES, subword, task)
    if "vocab_size" not in top and tokenizer is not None and not tokenizer.bpe:
        c.error("vocab_size", "missing")
    vocab = check_vocab_size(c, vocab, tokenizer, "vocab_size" in top)
    max_seq = c.pos_int("max_seq_len", top["max_seq_len"]) if "max_seq_len" in top else None
    head_dim = c.pos_int("head_dim", top.get("head_dim", 64))
    positions = c.choice("positions", top.get("positions", "rope"), POSITIONS)
    if positions == "rope" and head_dim is not None and head_dim % 2:
        c.error("head_dim", f"{head_dim} must be even for rotary positions")
    embed = c.int_list("embed_dim", top["embed_dim"]) if "embed_dim" in top else None
    depth = c.int_list("depth", top["depth"]) if "depth" in top else None

    layers = c.keys("layers", top.get("layers", {}), required=("heads", "ffn_dim", "attention")) if "layers" in top else {}
    heads = c.int_list("layers.heads", layers["heads"]) if "heads" in layers else None
    ffn = c.int_list("layers.ffn_dim", layers["ffn_dim"]) if "ffn_dim" in layers else None
    attention = None
    if "attention" in layers:
        raw = layers["attention"]
        if not isinstance(raw, list) or not raw:
            c.error("layers.attention", f"expected a non-empty list of attention types, got {shown(raw)}")
        else:
            specs = []
            for i, a in enumerate(raw):
                try:
                    spec = parse_attention(a)
                except ValueError as e:
                    c.error(f"layers.attention[{i}]", str(e))
                    continue
                if max_seq is not None:
                    for problem in spec_problems(spec, max_seq, heads or ()):
                        c.error(f"layers.attention[{i}]", problem)
                if task is not None and form is not None and not has_form(spec, form):
                    c.error(f"layers.attention[{i}]", f"{spec} has no {form} form, which task {task} needs")
                specs.append(str(spec))
            if len(specs) == len(raw):
                attention = c.unique("layers.attention", tuple(specs))

    byte_vocab = tokenizer.byte_vocab(vocab) if tokenizer is not None else None
    workloads = _workloads(c, top["latency"], max_seq, positions, task, form, byte_vocab) if "latency" in top else []
    memory = _memory(c, top.get("memory", 0), max_seq, positions, form, attention)

    if c.errors:
        raise SpaceError(c.errors)
    return Space(
        name=name,
        task=task,
        vocab_size=vocab,
        max_seq_len=max_seq,
        head_dim=head_dim,
        positions=positions,
        embed_dim=embed,
        depth=depth,
        heads=heads,
        ffn_dim=ffn,
        attention=attention,
        workloads=tuple(workloads),
        source=source,
        form=form or "",
        memory=memory,
        tokenizer=tokenizer,
    )


def _memory(c: Checker, value: Any, max_seq: int | None, positions: str | None, form: str | None,
            attention: tuple[str, ...] | None) -> int:
    """The ``memory:`` option (Transformer-XL's cached previous segment, :mod:`supernet.memory`): tokens, 0 = none.

    A causal model with rotary positions (keys from the previous segment keep their relative distance), fewer tokens
    than ``max_seq_len``, and attention types whose decoding cache may drop its oldest entries (``memory`` on the type:
    softmax and gqa attend to every key they hold)."""
    if value == 0:
        return 0
    if not is_int(value) or value < 1:
        c.error("memory", f"{shown(value)} is not a positive number of tokens")
        return 0
    if form != "causal":
        c.error("memory", "only a causal model (a decoder) carries a memory of its previous segment")
    if positions != "rope":
        c.error("memory", f"needs positions: rope (relative positions across segments), not {positions}")
    if max_seq is not None and value >= max_seq:
        c.error("memory", f"{value} tokens leave no room for a segment: memory must be below max_seq_len {max_seq}")
    for a in attention or ():
        if not getattr(types()[parse_attention(a).kind], "memory", False):
            c.error("memory", f"{a} cannot carry a memory (its decoding cache does not attend to every key it holds); "
                    "the types that can: " + ", ".join(sorted(n for n, t in types().items() if getattr(t, "memory", False))))
    return int(value)


def _workloads(c: Checker, lat: Any, max_seq: int | None, positions: str | None, task: str | None,
               form: str | None, byte_vocab: int | None = None) -> list[Workload]:
    """The ``latency:`` section: one or more named workloads, each ``prefill`` (batch_size, seq_len; or bytes: text in
    bytes, :class:`Workload`) or ``decode`` (batch_size, context); ``kind`` may be left out when the name is the kind.
    A prefill in bytes knows its tokens at the byte vocabulary (``byte_vocab``, where the space reads bytes: one a
    byte) from the start; a subword vocabulary's come from its tokenizer (:meth:`Workload.with_bytes_per_token`).

    A decode context may pass ``max_seq_len`` with rotary positions (``supernet.decode`` computes the
    angles of any position: timing at long contexts), not with learned ones (they end there)."""
    if not isinstance(lat, dict) or not lat:
        c.error("latency", f"expected a mapping of named workloads, e.g. {{prefill: {{batch_size: 1, seq_len: 256}}, "
                           f"decode: {{batch_size: 1, context: 255}}}}, got {shown(lat)}")
        return []
    out = []
    for wname, wdata in lat.items():
        path = f"latency.{wname}"
        if not isinstance(wname, str) or not _WORKLOAD_NAME.match(wname):
            c.error(path, "a workload name is a letter then letters, digits, - or _")
            continue
        kind = (wdata.get("kind") if isinstance(wdata, dict) else None) or (wname if wname in WORKLOAD_KINDS else None)
        if kind not in WORKLOAD_KINDS and isinstance(wdata, dict):
            c.error(f"{path}.kind", f"{shown(kind)} is not one of {', '.join(WORKLOAD_KINDS)}" if kind is not None else
                    f"missing (the name {shown(wname)} is not a kind; give kind: {' or '.join(WORKLOAD_KINDS)})")
            continue
        if kind == "decode" and task is not None and form is not None and form != "causal":
            c.error(path, f"a decode workload needs a causal task, not {task} (an encoder reads the whole sequence at once: "
                          "give a prefill workload)")
            continue
        text = kind == "prefill" and isinstance(wdata, dict) and "bytes" in wdata and "seq_len" not in wdata
        if text and task is not None and task != "causal-lm":
            c.error(f"{path}.bytes", f"a prefill in bytes of text is for a causal-lm space, not {task} (give seq_len)")
            continue
        size = "context" if kind == "decode" else "bytes" if text else "seq_len"
        w = c.keys(path, wdata, required=("batch_size", size), optional=("kind",))
        bs = c.pos_int(f"{path}.batch_size", w["batch_size"]) if "batch_size" in w else None
        n = c.pos_int(f"{path}.{size}", w[size]) if size in w else None
        if n is not None and max_seq is not None:
            if kind == "prefill" and n > max_seq and (not text or byte_vocab is not None):
                c.error(f"{path}.{size}", f"{n} exceeds max_seq_len {max_seq}" + (" (a byte-level model reads a token a byte)"
                                                                                 if text else ""))
            if kind == "decode" and n >= max_seq and positions == "learned":
                c.error(
                    f"{path}.context",
                    f"{n} leaves no position for the new token: learned positions end at max_seq_len {max_seq} "
                    f"(give at most {max_seq - 1}, or use positions: rope)",
                )
        if bs is not None and n is not None:
            if text:
                out.append(Workload(wname, bs, n, "prefill", text_bytes=n,
                                    vocab_tokens=((byte_vocab, n),) if byte_vocab is not None else ()))
            else:
                out.append(Workload(wname, bs, n, "prefill") if kind == "prefill" else
                           Workload(wname, bs, kind="decode", context=n))
    return out


def describe(space: Space) -> str:
    """A few human lines about the choices (used by ``nas space``): the space's task says them."""
    return registry.of(space).describe(space)


def describe_stack(space: Space) -> str:
    """:func:`describe` of a one-stack space."""
    lines = [
        f"space {space.name}  ({space.source}, hash {space.hash})",
        f"  task          {space.task}, vocab {space.vocab_size}, max_seq_len {space.max_seq_len}, "
        f"head_dim {space.head_dim}, positions {space.positions}",
        *([f"  tokenizer     {space.tokenizer}" + ("   (searched)" if space.tokenizer.searched else "")]
          if space.tokenizer.bpe else []),
        f"  embed_dim     {', '.join(map(str, space.embed_dim))}",
        f"  depth         {', '.join(map(str, space.depth))}",
        f"  heads         {', '.join(map(str, space.heads))}   (per layer; attention width = heads x {space.head_dim})",
        f"  ffn_dim       {', '.join(map(str, space.ffn_dim))}   (per layer)",
        f"  attention     {', '.join(space.attention)}   (per layer)",
        *([f"  memory        {space.memory} tokens of the previous segment (segments of {space.max_seq_len - space.memory} "
           "tokens; Transformer-XL)"] if space.memory else []),
    ]
    for w in space.workloads:
        what = (
            f"batch {w.batch_size} x {w.text_bytes:,} bytes of text (each vocabulary's tokens for them)" if w.text_bytes
            else f"batch {w.batch_size} x {w.seq_len} tokens"
            if w.kind == "prefill"
            else f"batch {w.batch_size} x 1 new token at context {w.context}"
        )
        lines.append(f"  latency       {w.name}: {w.kind}, {what}")
    n = space.size()
    lines.append(f"  subnets       {n:,} (~10^{math.log10(n):.1f})" if n < 10**60 else f"  subnets       ~10^{math.log10(n):.1f}")
    return "\n".join(lines)

"""The grammar of attention types: ``name`` or ``name:P1:P2`` with integer parameters.

This table is the single list of attention types a search space may name.  Each
entry gives the parameter names (in order) and one line of documentation.  The
implementations live in :mod:`supernet.attention`, keyed by the same names; a
test checks that both agree.  Adding a type means one line here and one
implementation there (plus, if a parameter has limits that depend on the space,
a rule in :func:`spec_problems`).
"""

from __future__ import annotations

from dataclasses import dataclass

# name -> (parameter names, description)
SIGNATURES: dict[str, tuple[tuple[str, ...], str]] = {
    "softmax": ((), "full causal softmax attention"),
    "gqa": (("G",), "causal softmax attention with G shared key/value heads (grouped-query attention)"),
    "local": (("W",), "causal sliding window: each token attends to itself and the W-1 tokens before it"),
    "dilated": (("W", "D"), "dilated causal window: itself and the W-1 tokens before it at strides of D (i, i-D, ..., i-(W-1)D)"),
    "strided": (("S",), "Sparse Transformer strided pattern: the S-token window plus every S-th token before it"),
    "fixed": (("S",), "Sparse Transformer fixed pattern: its own block of S tokens plus the last token of every earlier block"),
    "longformer": (("W", "G"), "Longformer: the W-token causal window plus the first G tokens (global)"),
    "bigbird": (("W", "G", "R"), "BigBird: W-token window + first G tokens + R random earlier blocks of W tokens (fixed seed)"),
    "linear": ((), "linear attention with the elu(x)+1 feature map, causal via prefix sums"),
    "relu-linear": ((), "linear attention with the ReLU feature map (EfficientViT), causal via prefix sums"),
    "cosformer": (("M",), "cosFormer: ReLU features re-weighted by cos(pi/2 * (i-j)/M), causal via prefix sums"),
    "performer": (("M",), "Performer FAVOR+: M positive orthogonal random features (fixed seed), causal via prefix sums"),
}


def allowed_forms() -> str:
    """The accepted spellings, e.g. ``softmax, local:W, linear``."""
    return ", ".join(":".join((name,) + params) for name, (params, _) in SIGNATURES.items())


@dataclass(frozen=True, order=True)
class AttentionSpec:
    """A parsed attention choice such as ``local:64`` -> ``AttentionSpec('local', (64,))``."""

    kind: str
    params: tuple[int, ...] = ()

    def __str__(self) -> str:
        return ":".join([self.kind, *map(str, self.params)])

    def param(self, name: str) -> int:
        names = SIGNATURES[self.kind][0]
        return self.params[names.index(name)]


def parse_attention(text: object) -> AttentionSpec:
    """Parse ``text`` into an :class:`AttentionSpec`; ``ValueError`` says what is allowed."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not one of {allowed_forms()}")
    name, *raw = text.strip().split(":")
    if name not in SIGNATURES:
        raise ValueError(f"{text!r} is not one of {allowed_forms()}")
    names = SIGNATURES[name][0]
    form = ":".join((name,) + names)
    if len(raw) != len(names):
        raise ValueError(f"{text!r} must be written {form}")
    params = []
    for pname, value in zip(names, raw):
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{text!r}: {pname} must be a positive integer (form {form})")
        params.append(int(value))
    return AttentionSpec(name, tuple(params))


def kv_heads(spec: AttentionSpec, heads: int) -> int:
    """Key/value heads of a layer with ``heads`` query heads: ``min(G, heads)`` for ``gqa:G``, else ``heads``.

    Elastic like the rest: a gqa layer uses the leading ``kv_heads * head_dim`` rows of the
    key and value projections.
    """
    return min(spec.param("G"), heads) if spec.kind == "gqa" else heads


def spec_problems(spec: AttentionSpec, max_seq_len: int, heads: tuple[int, ...]) -> list[str]:
    """Why ``spec`` does not fit a space with this ``max_seq_len`` and these ``heads`` choices (empty if it does)."""
    if spec.kind == "local" and spec.param("W") > max_seq_len:
        return [f"window {spec.param('W')} exceeds max_seq_len {max_seq_len}"]
    if spec.kind == "dilated":
        span = (spec.param("W") - 1) * spec.param("D") + 1
        if span > max_seq_len:
            return [f"{spec} spans {span} tokens ((W-1)*D+1), more than max_seq_len {max_seq_len}"]
    if spec.kind in ("strided", "fixed") and spec.param("S") > max_seq_len:
        return [f"stride {spec.param('S')} exceeds max_seq_len {max_seq_len}"]
    if spec.kind in ("longformer", "bigbird"):
        for name in ("W", "G"):
            if spec.param(name) > max_seq_len:
                return [f"{name}={spec.param(name)} exceeds max_seq_len {max_seq_len}"]
    if spec.kind == "cosformer" and spec.param("M") < max_seq_len:
        return [f"M={spec.param('M')} must be at least max_seq_len {max_seq_len} (the cosine weights turn negative beyond M)"]
    if spec.kind == "gqa":
        bad = [h for h in heads if h % kv_heads(spec, h)]
        if bad:
            return [
                f"{spec}: heads choice(s) {', '.join(map(str, bad))} are not a multiple of min(G, heads); "
                f"every heads choice must be divisible by min({spec.param('G')}, heads)"
            ]
    return []

"""The grammar of attention types: ``name`` or ``name:P1:P2`` with integer parameters.

This table is the single list of attention types a search space may name.  Each
entry gives the parameter names (in order) and one line of documentation.  The
implementations live in :mod:`supernet.attention`, keyed by the same names; a
test checks that both agree.  Adding a type means one line here and one
implementation there.
"""

from __future__ import annotations

from dataclasses import dataclass

# name -> (parameter names, description)
SIGNATURES: dict[str, tuple[tuple[str, ...], str]] = {
    "softmax": ((), "full causal softmax attention"),
    "local": (("W",), "causal sliding window: each token attends to itself and the W-1 tokens before it"),
    "linear": ((), "linear attention with the elu(x)+1 feature map, causal via prefix sums"),
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

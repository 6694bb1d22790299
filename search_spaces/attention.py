"""The grammar of attention types (``name`` or ``name:P1:P2`` with integer parameters) and the
registry the space layer validates spellings against.

The space layer does not define the types and imports no torch: each type is one object in its
family's file under :mod:`supernet.attention`, and registering it there *declares* its signature
here (:func:`declare`).  A space, a subnet or a spelling is checked against :func:`types`, which
fills itself on first use from the ``nas_transformers.attention`` entry points (the package
declares ``supernet.attention``; another package can add its own types the same way).

What the space layer reads of a type (:class:`TypeSignature`): its name, parameter names, one
line of documentation, its ``forms`` (``causal`` for a decoder task, ``bidirectional`` for an
encoder task: a space is refused when a type lacks the form its task needs) and
``memory`` (whether a space's ``memory:`` may use it) and
``problems(spec, max_seq_len, heads)``: why a spelling does not fit a space (a window longer than
``max_seq_len``, a grouped-query count that does not divide a heads choice, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .registry import Registry

ENTRY_POINTS = "nas_transformers.attention"
FORMS = ("causal", "bidirectional")  # causal: query i sees keys j <= i; bidirectional: every key


class TypeSignature(Protocol):
    """What the space layer knows of an attention type (the type object itself satisfies it)."""

    name: str
    params: tuple[str, ...]
    doc: str
    forms: tuple[str, ...]  # a subset of FORMS
    memory: bool  # may carry a space's ``memory:`` (its decoding cache attends to every key it holds; default False)

    def problems(self, spec: "AttentionSpec", max_seq_len: int, heads: tuple[int, ...]) -> list[str]: ...


def _check_name(name: str, signature: TypeSignature) -> None:
    if ":" in name:
        raise ValueError(f"attention type name {name!r}: expected a non-empty word without ':' or spaces")


# The one registry of attention types: the type objects themselves (supernet.attention registers each one beside its
# definition; the space layer reads their signatures).  Filled on first use from the entry points.
TYPES: Registry[TypeSignature] = Registry("attention type", ENTRY_POINTS, check=_check_name, flag="attention")


def declare(signature: TypeSignature) -> TypeSignature:
    """Add a type (called by ``supernet.attention.register``); a second type of the same name is refused."""
    return TYPES.register(signature)


def withdraw(name: str) -> None:
    """Remove a declared type (tests that define a type of their own)."""
    TYPES.unregister(name)


def types() -> dict[str, TypeSignature]:
    """Every declared attention type by name, loading the installed type packages on first use."""
    found = TYPES.all()
    if not found:
        raise RuntimeError(
            f"no attention types: no package declares the {ENTRY_POINTS!r} entry point "
            "(install this project with `pip install -e .`, or import supernet.attention first)"
        )
    return found


def allowed_forms() -> str:
    """The accepted spellings, e.g. ``softmax, local:W, linear``."""
    return ", ".join(":".join((t.name, *t.params)) for t in types().values())


@dataclass(frozen=True, order=True)
class AttentionSpec:
    """A parsed attention choice such as ``local:64`` -> ``AttentionSpec('local', (64,))``."""

    kind: str
    params: tuple[int, ...] = ()

    def __str__(self) -> str:
        return ":".join([self.kind, *map(str, self.params)])

    def param(self, name: str) -> int:
        return self.params[types()[self.kind].params.index(name)]


def parse_attention(text: object) -> AttentionSpec:
    """Parse ``text`` into an :class:`AttentionSpec`; ``ValueError`` says what is allowed."""
    known = types()
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not one of {allowed_forms()}")
    name, *raw = text.strip().split(":")
    if name not in known:
        raise ValueError(f"{text!r} is not one of {allowed_forms()}")
    names = known[name].params
    form = ":".join((name, *names))
    if len(raw) != len(names):
        raise ValueError(f"{text!r} must be written {form}")
    params = []
    for pname, value in zip(names, raw):
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{text!r}: {pname} must be a positive integer (form {form})")
        params.append(int(value))
    return AttentionSpec(name, tuple(params))


def has_form(spec: AttentionSpec, form: str) -> bool:
    """Whether ``spec``'s type has the ``form`` (``causal`` or ``bidirectional``) of attention."""
    assert form in FORMS, form
    return form in types()[spec.kind].forms


def grid_problems(spec: AttentionSpec, side: int) -> list[str]:
    """Why a layer of ``spec`` cannot run on a square grid of ``side`` x ``side`` tokens (an image space's grid at one
    of its resolutions and patches); empty for a type that runs on any grid, or that reads no grid (a 1D type)."""
    check = getattr(types()[spec.kind], "grid_problems", None)
    return list(check(spec, side)) if check is not None else []


def spec_problems(spec: AttentionSpec, max_seq_len: int, heads: tuple[int, ...]) -> list[str]:
    """Why ``spec`` does not fit a space with this ``max_seq_len`` and these ``heads`` choices (empty if it does)."""
    return types()[spec.kind].problems(spec, max_seq_len, heads)

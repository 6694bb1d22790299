"""ListOps as Long Range Arena generates it (``lra_benchmarks/data/listops.py``, Apache-2.0, Tay et al. 2021).

A tree is a value 0-9 or an operator applied to 2 .. ``max_args`` subtrees, written prefix with a closing
bracket: ``[MAX 2 9 [MIN 4 7 ] 0 ]``.  The operators are MIN, MAX, MED (the median, rounded down as
``int(np.median)``) and SM (the sum modulo 10); the label is the tree's value (10 classes).  As LRA's
``generate_tree``: below ``max_depth`` a node is a value with probability 1 - ``VALUE_P`` (0.75), else an
operator with ``randint(2, max_args)`` arguments, each drawn the same way one level deeper; at ``max_depth`` a
node is a value.  A tree's length counts its values, operators and closing brackets (LRA's ``length``: 2 per
operator) and is kept when ``min_length < length < max_length`` (strictly, as LRA's filter), duplicates dropped
(LRA keeps a set).  The tokens are LRA's tokenizer's: its ``to_string`` writes parentheses around every pair of
its nested tuples, and its input pipeline drops them, so the tokens are exactly the values, operators and ``]``
counted by ``length``.

What differs from LRA: the draws come from an explicit ``np.random.Generator`` (LRA uses Python's global
``random``), so the same seed gives the same examples, but not LRA's files; the examples keep the order they were
drawn in (LRA iterates a Python set, an order that varies between runs); the tree is a nested list, not LRA's
left-nested pairs (the same tokens and values).
"""

from __future__ import annotations

from typing import Union

import numpy as np

MIN, MAX, MED, SUM_MOD, END = "[MIN", "[MAX", "[MED", "[SM", "]"
OPERATORS = (MIN, MAX, MED, SUM_MOD)
VALUES = tuple(range(10))
VALUE_P = 0.25  # LRA's name: a node below max_depth is an operator when random() <= VALUE_P
MAX_ARGS, MAX_DEPTH = 10, 10
MIN_LENGTH, MAX_LENGTH = 500, 2000
DIGITS = tuple(str(v) for v in VALUES)  # one string object per digit, shared by every example's tokens
SYMBOLS = (MAX, MIN, MED, SUM_MOD, END, *DIGITS)  # the fixed vocabulary (15 symbols)
VERSION = 1  # bump when the same seed would give other examples

Tree = Union[int, tuple]  # a value, or (operator, [subtrees])


def generate_tree(rng: np.random.Generator, depth: int = 1, max_depth: int = MAX_DEPTH, max_args: int = MAX_ARGS
                  ) -> tuple[Tree, int]:
    """(tree, length) drawn as LRA's ``generate_tree(depth, max_depth, max_args)`` draws it (see the module doc)."""
    r = rng.random() if depth < max_depth else 1.0
    if r > VALUE_P:
        return int(rng.integers(0, 10)), 1
    n_args = int(rng.integers(2, max_args + 1))  # random.randint(2, max_args): both ends included
    args, length = [], 2
    for _ in range(n_args):
        sub, sub_length = generate_tree(rng, depth + 1, max_depth, max_args)
        args.append(sub)
        length += sub_length
    op = OPERATORS[int(rng.integers(0, len(OPERATORS)))]
    return (op, args), length


def tokens(tree: Tree) -> list[str]:
    """The tree's tokens, prefix, as LRA's tokenizer leaves them: ``[MAX 2 9 ]``."""
    out: list[str] = []

    def walk(t: Tree) -> None:
        if isinstance(t, int):
            out.append(DIGITS[t])
            return
        out.append(t[0])
        for a in t[1]:
            walk(a)
        out.append(END)

    walk(tree)
    return out


def value(tree: Tree) -> int:
    """The tree's value, as LRA's ``to_value``: MIN, MAX, MED (``int(np.median)``), SM (sum modulo 10)."""
    if isinstance(tree, int):
        return tree
    op, args = tree
    vals = [value(a) for a in args]
    if op == MIN:
        return min(vals)
    if op == MAX:
        return max(vals)
    if op == MED:
        return int(np.median(vals))
    if op == SUM_MOD:
        return sum(vals) % 10
    raise ValueError(f"unknown ListOps operator {op!r}")


def evaluate(toks: list[str] | tuple[str, ...]) -> int:
    """The value of a token sequence (an independent check of :func:`value`: a stack machine over the tokens)."""
    stack: list[list] = [[None, []]]
    for t in toks:
        if t in OPERATORS:
            stack.append([t, []])
        elif t == END:
            op, args = stack.pop()
            if op is None:
                raise ValueError("']' without an operator")
            stack[-1][1].append(value((op, args)))
        elif t in {str(v) for v in VALUES}:
            stack[-1][1].append(int(t))
        else:
            raise ValueError(f"not a ListOps token: {t!r}")
    if len(stack) != 1 or len(stack[0][1]) != 1:
        raise ValueError(f"not one whole expression ({len(stack) - 1} operators open)")
    return stack[0][1][0]


def generate(n: int, seed: int, min_length: int = MIN_LENGTH, max_length: int = MAX_LENGTH, max_depth: int = MAX_DEPTH,
             max_args: int = MAX_ARGS, max_draws: int | None = None, progress=None) -> list[tuple[int, list[str]]]:
    """``n`` distinct examples (label, tokens) with ``min_length < len(tokens) < max_length``, drawn from ``seed``
    (:func:`rows`, listed)."""
    return list(rows(n, seed, min_length, max_length, max_depth, max_args, max_draws, progress))


def rows(n: int, seed: int, min_length: int = MIN_LENGTH, max_length: int = MAX_LENGTH, max_depth: int = MAX_DEPTH,
         max_args: int = MAX_ARGS, max_draws: int | None = None, progress=None):
    """Yield ``n`` distinct examples (label, tokens) with ``min_length < len(tokens) < max_length``, drawn from ``seed``.

    Trees are drawn until ``n`` pass the length filter; ``max_draws`` (default ``1000 * n + 10_000``) bounds the
    draws: a filter that cannot be met raises ValueError naming it instead of looping forever.  Duplicates are
    recognised by a 16-byte digest of their tokens (LRA's 96,000 examples would hold gigabytes as token tuples)."""
    import hashlib

    if n < 0:
        raise ValueError(f"n: {n} is negative")
    if not 0 <= min_length < max_length:
        raise ValueError(f"lengths: {min_length}..{max_length} is not a range (0 <= min < max)")
    rng = np.random.default_rng([seed, 1])
    limit = max_draws if max_draws is not None else 1000 * n + 10_000
    seen: set[bytes] = set()
    draws = 0
    while len(seen) < n:
        if draws >= limit:
            raise ValueError(f"ListOps: {len(seen)} of {n} examples of length {min_length}..{max_length} after {draws} "
                             f"trees (depth {max_depth}, {max_args} arguments): the filter is too narrow")
        draws += 1
        tree, length = generate_tree(rng, 1, max_depth, max_args)
        if not min_length < length < max_length:
            continue
        toks = tokens(tree)
        assert len(toks) == length, (len(toks), length)
        key = hashlib.blake2b(" ".join(toks).encode(), digest_size=16).digest()
        if key in seen:
            continue
        seen.add(key)
        yield value(tree), toks
        if progress is not None:
            progress(len(seen), n)

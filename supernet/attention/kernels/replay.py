"""Replay recorded kernel calls through the C library of the kernels (``c_api.cpp``), with numpy and ctypes only.

    python3 replay.py LIB.so CALLS.npz OUT.npz

CALLS.npz holds ``manifest`` (JSON: per call its kernel's name, its positional arguments as kinds and values, and
which arrays it writes) and each array argument as ``c{call}_a{arg}`` (its contents when the call was made).  Each
call runs on fresh copies of its arrays; what it writes goes to OUT.npz under the same keys, with ``isa``, the
instruction set of the library.  It runs where torch does not: the Neon build's parity check runs it under emulated
aarch64 (tests/supernet/attention/test_neon_kernels.py), where its Python has numpy alone.  A kernel's refusal: its
message, exit 1.
"""

from __future__ import annotations

import ctypes
import json
import sys

import numpy as np

ARRAY, INTEGER, REAL, LIST = 0, 1, 2, 3


class Arg(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("data", ctypes.c_void_p),
        ("ndim", ctypes.c_int64),
        ("sizes", ctypes.c_int64 * 4),
        ("strides", ctypes.c_int64 * 4),
        ("integer", ctypes.c_int64),
        ("real", ctypes.c_double),
        ("list", ctypes.POINTER(ctypes.c_int64)),
        ("count", ctypes.c_int64),
    ]


def library(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    lib.nas_call.argtypes = [ctypes.c_char_p, ctypes.POINTER(Arg), ctypes.c_int64, ctypes.c_char_p, ctypes.c_int64]
    lib.nas_call.restype = ctypes.c_int
    lib.nas_isa.restype = ctypes.c_char_p
    return lib


def call(lib: ctypes.CDLL, name: str, args: list) -> None:
    """``name`` with positional ``args``: numpy arrays (float32 or int64, strides in whole elements), ints, floats or
    lists of ints.  Raises RuntimeError with the kernel's message."""
    packed = (Arg * len(args))()
    keep = []  # what the pointers point into, alive until the call returns
    for a, x in zip(packed, args):
        if isinstance(x, np.ndarray):
            assert x.dtype in (np.float32, np.int64) and x.ndim <= 4, (x.dtype, x.shape)
            a.kind, a.dtype, a.data, a.ndim = ARRAY, 0 if x.dtype == np.float32 else 1, x.ctypes.data, x.ndim
            for i in range(x.ndim):
                a.sizes[i], a.strides[i] = x.shape[i], x.strides[i] // x.itemsize
        elif isinstance(x, (bool, int)):
            a.kind, a.integer = INTEGER, int(x)
        elif isinstance(x, float):
            a.kind, a.real = REAL, x
        else:
            values = (ctypes.c_int64 * len(x))(*x)
            keep.append(values)
            a.kind, a.list, a.count = LIST, values, len(x)
    err = ctypes.create_string_buffer(512)
    if lib.nas_call(name.encode(), packed, len(args), err, len(err)) != 0:
        raise RuntimeError(err.value.decode())


def replay(lib_path: str, calls_path: str, out_path: str) -> None:
    lib = library(lib_path)
    stored = np.load(calls_path)
    manifest = json.loads(str(stored["manifest"]))
    out = {"isa": np.array(lib.nas_isa().decode())}
    for i, c in enumerate(manifest):
        args = []
        for j, (kind, value) in enumerate(c["args"]):
            args.append(np.array(stored[f"c{i}_a{j}"]) if kind == "array" else value)  # a fresh, writable copy
        call(lib, c["name"], args)
        for j in c["writes"]:
            out[f"c{i}_a{j}"] = args[j]
    np.savez(out_path, **out)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("\n\n")[1])
    try:
        replay(*sys.argv[1:])
    except RuntimeError as e:
        print(f"replay: {e}", file=sys.stderr)
        sys.exit(1)

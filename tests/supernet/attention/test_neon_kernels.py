"""The kernels' aarch64 Neon build gives the float64 references' numbers and gradients for every type it serves.

The host has no ARM core, and the emulated aarch64 root (scripts/emulated_arm.py) has numpy and no torch; so each
type's forward (no gradient: the inference paths) and forward + backward run here through torch with the host kernels,
recording every kernel call with its arguments (``Recorder``); the calls are replayed by the C library of the same
source (``kernels/c_api.cpp``, cross-compiled for aarch64) under qemu user-mode emulation (``kernels/replay.py``); then
the types run here again with each call's outputs taken from the Neon replay (``Replayer``), and their results and
gradients are compared with the float64 reference.  The same replay through the host's own C library (``native``)
checks the path without emulation.  Timing under emulation means nothing; correctness does.

Needs ``aarch64-linux-gnu-g++`` (Debian's g++-aarch64-linux-gnu) and ``qemu-aarch64-static`` (qemu-user-static), and
the emulated root (built once from Debian's and PyPI's registries); skipped with the reason where one is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from search_spaces import parse_attention
from supernet.attention import attend, attend_reference, kv_heads, native
from supernet.attention.registry import get

ROOT = Path(__file__).resolve().parents[3]
REPLAY = native.KERNELS / "replay.py"
# every type the kernels serve, causal and (where the kernel takes it) bidirectional; msla, lsra and convmod: their
# convolutions (dwconv_forward); hydra: inference only
CASES = [
    ("local:17", True), ("local:17", False), ("local:64", True), ("dilated:4:3", True), ("dilated:4:3", False),
    ("longformer:16:5", True), ("longformer:16:5", False), ("bigbird:16:5:2", True), ("fixed:32", True),
    ("strided:7", True), ("strided:16", True), ("linear", True), ("relu-linear", True), ("cosformer:300", True),
    ("performer:32", True), ("sima", True), ("msla:3", True), ("msla:3", False), ("lsra:4", True), ("convmod:3", True),
    ("hydra", True), ("hydra", False),
]  # fmt: skip
LENGTHS = (33, 100)  # neither a whole number of the kernels' 16-row blocks: the ragged last block too
# which positional arguments each kernel writes (torch_module.cpp's signatures)
WRITES = {"window_forward": (3, 4), "window_backward": (5, 6, 7), "linear_forward": (3, 10), "linear_backward": (6, 7, 8),
          "dwconv_forward": (2,), "hydra_forward": (3,)}


class Recorder:
    """Stands in for native._kernel(): each call's name and arguments (arrays as their contents then), then the real
    kernel."""

    def __init__(self):
        self.calls: list[tuple[str, list]] = []

    def __call__(self):
        return self

    def __getattr__(self, name):
        def call(*args):
            self.calls.append((name, [a.detach().numpy().copy() if isinstance(a, torch.Tensor) else a for a in args]))
            return getattr(native._loaded()[0], name)(*args)

        return call


class Replayer:
    """Stands in for native._kernel(): call i writes the outputs the replay gave for call i (same kernel asked)."""

    def __init__(self, recorded: list[tuple[str, list]], outputs: dict[str, np.ndarray], first: int):
        self.recorded, self.outputs, self.i = recorded, outputs, first

    def __call__(self):
        return self

    def __getattr__(self, name):
        def call(*args):
            want, _ = self.recorded[self.i]
            assert name == want, (self.i, name, want)
            with torch.no_grad():
                for j in WRITES[name]:
                    key = f"c{self.i}_a{j}"
                    if key in self.outputs:
                        args[j].copy_(torch.from_numpy(self.outputs[key]))
            self.i += 1

        return call


def inputs(spec, causal: bool, t: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    h, d = 2, 32
    hk, hv = kv_heads(spec, h)
    q = torch.randn(1, h, t, d, generator=g)
    k = torch.randn(1, hk, t, d, generator=g)
    v = torch.randn(1, hv, t, d, generator=g)
    w = {n: torch.randn(*s, generator=g) * 0.3 for n, s in get(spec).weights(spec, h, d, 512).items()}
    return q, k, v, w


def run_case(spec, causal: bool, t: int, seed: int, backward: bool):
    """(output, gradients of q, k, v and the weights, or None) of one type through torch and whatever _kernel is."""
    q, k, v, w = inputs(spec, causal, t, seed)
    if not backward:
        with torch.no_grad():
            return attend(q, k, v, spec, w, causal=causal), None
    leaves = [x.requires_grad_() for x in (q, k, v, *w.values())]
    out = attend(q, k, v, spec, w, causal=causal)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1))
    return out.detach(), torch.autograd.grad(out, leaves, grad_out, allow_unused=True)


def reference(spec, causal: bool, t: int, seed: int, backward: bool):
    q, k, v, w = (x.double() if isinstance(x, torch.Tensor) else {n: y.double() for n, y in x.items()}
                  for x in inputs(spec, causal, t, seed))
    if not backward:
        return attend_reference(q, k, v, spec, w, causal=causal), None
    leaves = [x.requires_grad_() for x in (q, k, v, *w.values())]
    out = attend_reference(q, k, v, spec, w, causal=causal)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).double()
    return out.detach(), torch.autograd.grad(out, leaves, grad_out, allow_unused=True)


def runs():
    """(spec, causal, t, seed, backward) of every run: each case's forward (no gradient: the inference paths) and its
    forward + backward (the training paths; hydra's and the convolutions' train in torch) at each length."""
    for name, causal in CASES:
        for t in LENGTHS:
            yield name, causal, t, t, False
            yield name, causal, t, t, True


def record(tmp: Path) -> tuple[list, list[tuple[int, int]], Path]:
    """Every run's kernel calls, recorded (host kernels), saved as replay.py reads them; per run its calls' range."""
    recorder = Recorder()
    spans = []
    saved = native._kernel
    native._kernel = recorder
    try:
        for name, causal, t, seed, backward in runs():
            first = len(recorder.calls)
            run_case(parse_attention(name), causal, t, seed, backward)
            spans.append((first, len(recorder.calls)))
    finally:
        native._kernel = saved
    manifest, arrays = [], {}
    for i, (name, args) in enumerate(recorder.calls):
        kinds = []
        for j, a in enumerate(args):
            if isinstance(a, np.ndarray):
                arrays[f"c{i}_a{j}"] = np.ascontiguousarray(a)
                kinds.append(("array", None))
            elif isinstance(a, bool):
                kinds.append(("int", int(a)))
            elif isinstance(a, int):
                kinds.append(("int", a))
            elif isinstance(a, float):
                kinds.append(("real", a))
            else:
                kinds.append(("list", [int(x) for x in a]))
        writes = [j for j in WRITES[name] if args[j].size > 0]
        manifest.append({"name": name, "args": kinds, "writes": writes})
    path = tmp / "calls.npz"
    np.savez(path, manifest=np.array(json.dumps(manifest)), **arrays)
    return recorder.calls, spans, path


def check(recorded, spans, outputs: dict[str, np.ndarray]) -> dict:
    """Every run again with the replay's outputs: the worst error against float64, forward and backward, per type."""
    worst: dict[str, list[float]] = {}
    saved = native._kernel
    try:
        for (name, causal, t, seed, backward), (first, end) in zip(runs(), spans):
            spec = parse_attention(name)
            replayer = Replayer(recorded, outputs, first)
            native._kernel = replayer
            out, grads = run_case(spec, causal, t, seed, backward)
            assert replayer.i == end, (name, causal, t, backward, replayer.i, end)  # the same calls, all replayed
            ref, ref_grads = reference(spec, causal, t, seed, backward)
            key = f"{name}{'' if causal else ' (bidirectional)'}"
            row = worst.setdefault(key, [0.0, 0.0, 0])
            row[0] = max(row[0], (out.double() - ref).abs().max().item() / max(1.0, ref.abs().max().item()))
            if backward:
                for a, b in zip(grads, ref_grads):
                    if b is not None:
                        row[1] = max(row[1], (a.double() - b).abs().max().item() / max(1.0, b.abs().max().item()))
            row[2] += end - first
    finally:
        native._kernel = saved
    return worst


def cross_compile(compiler: str, flags: list[str], out: Path) -> Path:
    sources = [str(native.SOURCE), str(native.KERNELS / "c_api.cpp")]
    done = subprocess.run([compiler, "-O3", "-std=c++17", "-shared", "-fPIC", *flags, *sources, "-o", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def assert_parity(worst: dict, isa: str) -> None:
    print(f"{isa}: worst |error| / max(1, |reference|) per type (forward, backward, kernel calls):")
    for key, (fwd, bwd, n) in worst.items():
        print(f"  {key:32s} {fwd:.2e} {bwd:.2e} {n:3d}")
    served = {k for k, (_, _, n) in worst.items()}
    assert served == {f"{n}{'' if c else ' (bidirectional)'}" for n, c in CASES}
    assert all(n > 0 for _, _, n in worst.values()), worst  # each type went through the kernels
    assert max(f for f, _, _ in worst.values()) <= 1e-5, worst
    assert max(b for _, b, _ in worst.values()) <= 1e-4, worst


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    if not native.status()[0]:
        pytest.skip(f"the compiled kernels are not used here: {native.status()[1]}")
    tmp = tmp_path_factory.mktemp("neon")
    calls, spans, path = record(tmp)
    return calls, spans, path, tmp


def test_the_c_library_replays_the_host_kernels_calls(recorded):
    """The C library (c_api.cpp), built for this host's best ISA, replayed by replay.py in a plain Python: the
    references' numbers through every type (what the Neon check below does under emulation)."""
    calls, spans, path, tmp = recorded
    compiler = os.environ.get("CXX", "c++")
    isa = native.runnable_isas()[0]
    lib = cross_compile(compiler, native.ISA_FLAGS[isa], tmp / f"libnas_kernels_{isa}.so")
    out = tmp / f"{isa}.npz"
    done = subprocess.run([sys.executable, str(REPLAY), str(lib), str(path), str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = dict(np.load(out))
    assert str(outputs.pop("isa")) == isa
    assert_parity(check(calls, spans, outputs), isa)


def emulated_arm():
    spec = importlib.util.spec_from_file_location("emulated_arm", ROOT / "scripts" / "emulated_arm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(1200)
@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None,
                    reason="aarch64-linux-gnu-g++ is not installed (apt-get install g++-aarch64-linux-gnu)")
@pytest.mark.skipif(shutil.which("qemu-aarch64-static") is None,
                    reason="qemu-aarch64-static is not installed (apt-get install qemu-user-static)")
def test_the_neon_build_gives_the_references_numbers_and_gradients(recorded):
    calls, spans, path, tmp = recorded
    script = emulated_arm()
    try:
        root = script.ensure_root(script.default_root(), log=lambda _line: None)
    except script.Refused as e:
        pytest.skip(f"the emulated aarch64 root could not be built: {e}")
    lib = cross_compile("aarch64-linux-gnu-g++", [], tmp / "libnas_kernels_neon.so")
    out = tmp / "neon.npz"
    cmd = [*script.python_cmd(root), str(REPLAY), str(lib), str(path), str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "NAS_"))}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1100)
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = dict(np.load(out))
    assert str(outputs.pop("isa")) == "neon"
    assert_parity(check(calls, spans, outputs), "neon")

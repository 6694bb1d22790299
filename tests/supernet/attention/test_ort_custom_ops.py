"""ONNX Runtime custom operators (supernet/attention/ort_ops.py, kernels/ort_ops.cpp): only inside ``emitting()`` does
an export write the ``nas.kernels`` node (one node where the standard graph has dozens); both graphs give the float64
reference's numbers in ONNX Runtime at lengths off the kernels' blocks, one thread and two (bigbird's random blocks
drawn by the operator for each length: 257 tokens are 17 blocks of 16, R up to 8 with repeats); a session of a
custom-op graph registers the library itself, and says why where it cannot; the types without an operator keep their
standard graph."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from search_spaces import parse_attention
from supernet.attention import attend, attend_reference, native, ort_ops
from supernet.onnx_export import DEFAULT_OPSET, _quiet, onnx_session

pytestmark = pytest.mark.skipif(ort_ops.library()[0] is None, reason=f"no custom-op library here: {ort_ops.library()[1]}")

CUSTOM = [("local:64", True), ("local:17", False), ("dilated:8:4", True), ("dilated:8:4", False), ("longformer:16:5", True),
          ("strided:16", True), ("strided:7", True), ("fixed:32", True), ("linear", True), ("relu-linear", True),
          ("hydra", True), ("hydra", False), ("bigbird:16:5:2", True), ("bigbird:16:1:8", True)]  # fmt: skip
STANDARD = [("bigbird:16:5:2", False), ("longformer:16:5", False), ("cosformer:300", True), ("linear", False)]


class Mixing(torch.nn.Module):
    def __init__(self, spec, causal):
        super().__init__()
        self.spec, self.causal = spec, causal

    def forward(self, q, k, v):
        return attend(q, k, v, self.spec, {}, causal=self.causal)


def export(spec, causal, path, d=32):
    x = tuple(torch.randn(2, 2, 64, d) for _ in range(3))  # (the graph keeps the batch of 2)
    seq = torch.export.Dim("seq", max=2048)
    with _quiet(), torch.no_grad():
        program = torch.onnx.export(Mixing(spec, causal).eval(), x, dynamo=True, opset_version=DEFAULT_OPSET,
                                    dynamic_shapes=({2: seq},) * 3, input_names=["q", "k", "v"], output_names=["y"],
                                    custom_translation_table=ort_ops.translation_table(), verbose=False)
        program.save(str(path))
    return path


def worst(path, spec, causal, threads, d=32) -> float:
    session = onnx_session(path, threads=threads)
    err = 0.0
    for t in (1, 33, 257):
        g = torch.Generator().manual_seed(t)
        x = [torch.randn(2, 2, t, d, generator=g) for _ in range(3)]
        out = session.run(None, dict(zip("qkv", (a.numpy() for a in x))))[0]
        ref = attend_reference(*(a.double() for a in x), spec, {}, causal=causal).numpy()
        err = max(err, float(np.abs(out - ref).max()))
    return err


@pytest.mark.parametrize("name,causal", CUSTOM, ids=[f"{n}-{'causal' if c else 'bidirectional'}" for n, c in CUSTOM])
def test_custom_and_standard_graphs_both_give_the_reference(name, causal, tmp_path):
    spec = parse_attention(name)
    standard = export(spec, causal, tmp_path / "standard.onnx")
    with ort_ops.emitting():
        custom = export(spec, causal, tmp_path / "custom.onnx")
    nodes = [n for n in onnx.load(str(custom)).graph.node]
    assert [n.domain for n in nodes] == [ort_ops.DOMAIN] and ort_ops.uses_custom_ops(custom), nodes
    assert not ort_ops.uses_custom_ops(standard)
    assert all(n.domain == "" for n in onnx.load(str(standard)).graph.node)
    for threads in (1, 2):
        assert worst(custom, spec, causal, threads) <= 1e-5, (name, threads)
    assert worst(standard, spec, causal, 1) <= 1e-4


@pytest.mark.parametrize("name,causal", STANDARD, ids=[f"{n}-{'causal' if c else 'bidirectional'}" for n, c in STANDARD])
def test_types_without_an_operator_keep_their_standard_graph(name, causal, tmp_path):
    spec = parse_attention(name)
    with ort_ops.emitting():
        path = export(spec, causal, tmp_path / "g.onnx")
    assert not ort_ops.uses_custom_ops(path)
    assert worst(path, spec, causal, 1) <= 1e-4


def test_a_custom_graph_without_its_library_says_why(tmp_path, monkeypatch):
    with ort_ops.emitting():
        path = export(parse_attention("local:64"), True, tmp_path / "g.onnx")
    monkeypatch.setattr(ort_ops, "library", lambda: (None, "no C++ compiler ('c++' not on PATH)"))
    with pytest.raises(RuntimeError, match=r"uses the nas.kernels custom operators \(exported with --custom-ops\) and their "
                       r"library is not available: no C\+\+ compiler"):
        onnx_session(path)


def test_the_library_is_cached_per_instruction_set():
    path, why = ort_ops.library()
    isa = native.choose_isa()[0]
    assert why == "" and path.name == f"libnas_ort_ops_{isa}.so" and path.parent.name.startswith(f"{isa}-")
    assert ort_ops.status_line().startswith(f"available ({isa}, {path})")

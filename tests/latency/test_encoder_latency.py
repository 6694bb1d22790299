"""Latency of masked-LM encoders (issue 17): the ONNX forms of an encoder are bidirectional (a fused ``Attention``
without the causal flag for the softmax family), the stitched timing graphs compute the encoder, and
``nas measure-latency`` times an encoder space on cpu, onnxruntime and as an arm bundle.  (A masked-lm space with a
decode workload is refused when it loads: tests/supernet/test_bidirectional.py.)"""

import tarfile
from collections import Counter

import numpy as np
import pytest
import torch

from latency.onnx_graphs import cached_graph, with_weights
from latency.table import read_timings
from nas.cli import main
from search_spaces import LayerChoice
from supernet.model import Transformer, TransformerConfig
from supernet.onnx_export import export_onnx, onnx_parity, onnx_session

from tests.tasks.masked_lm.test_masked_lm import ENCODER
from tests.supernet.test_train import one_thread  # noqa: F401  (autouse)

pytestmark = pytest.mark.usefixtures("graph_cache")  # a module-wide ONNX graph cache (conftest)

LAYERS = (LayerChoice(2, 32, "softmax"), LayerChoice(2, 32, "linear"), LayerChoice(2, 64, "gqa:1"))


def model(causal: bool) -> Transformer:
    config = TransformerConfig(256, 32, 8, "rope", 24, LAYERS, causal=causal)
    return Transformer(config, generator=torch.Generator().manual_seed(0)).eval()


def attention_flags(path) -> list[int]:
    import onnx

    nodes = [n for n in onnx.load(str(path), load_external_data=False).graph.node if n.op_type == "Attention"]
    return [next((a.i for a in n.attribute if a.name == "is_causal"), 0) for n in nodes]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The encoder's one-piece ONNX export."""
    return export_onnx(model(causal=False), tmp_path_factory.mktemp("whole") / "enc.onnx")


def test_encoder_export_is_a_bidirectional_attention_node_with_parity(whole, tmp_path):
    encoder, decoder = model(causal=False), model(causal=True)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (encoder(tokens)[:, 0] - decoder(tokens)[:, 0]).abs().max() > 1e-3  # the first byte sees the rest
    path = whole
    assert onnx_parity(path, encoder, tokens) <= 1e-4
    flags = attention_flags(path)
    assert len(flags) >= 2 and set(flags) == {0}  # softmax and gqa: fused Attention without the causal flag
    assert Counter(attention_flags(export_onnx(decoder, tmp_path / "dec.onnx")))[1] == 2  # the decoder's softmax and gqa


def test_stitched_timing_graph_computes_the_encoder(whole, tmp_path):
    """The timing graphs are stitched from generic parts; an encoder's parts are its own (not the causal ones)."""
    from latency.onnx_graphs import _parts

    encoder = model(causal=False)
    keys = [[p["key"] for p in _parts(m)] for m in (encoder, model(causal=True))]
    assert all(a != b for a, b in zip(*keys))  # no part of the encoder's graph is a cached causal part
    graph, tensors = cached_graph(encoder, tmp_path)
    session = onnx_session(with_weights(graph, tensors, encoder, tmp_path / "own"), threads=1)
    for shape in [(1, 5), (2, 19), (3, 32)]:
        tokens = torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(2))
        out = session.run(None, {"input_ids": tokens.numpy()})[0]
        with torch.no_grad():
            assert np.abs(out - encoder(tokens).numpy()).max() < 1e-4, shape
    import onnx

    counts = Counter(n.op_type for n in onnx.load(str(graph), load_external_data=False).graph.node)
    ops = Counter(n.op_type for n in onnx.load(str(whole)).graph.node)
    assert counts["Attention"] == ops["Attention"] == 2 and set(attention_flags(graph)) == {0}


@pytest.fixture(scope="module")
def space_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("space") / "enc.yaml"
    path.write_text(ENCODER)
    return path


QUICK = ["--samples", "3", "--retest", "0", "--timing-threads", "1", "--timing-warmup", "1", "--repeats", "2", "--rounds", "1",
         "--min-sample-ms", "1"]


@pytest.mark.parametrize("device", ["cpu", "onnxruntime"])
def test_measure_latency_times_an_encoder_space(space_file, tmp_path, capsys, device):
    out = tmp_path / "t.csv"
    assert main(["measure-latency", str(space_file), "--device", device, "--out", str(out), *QUICK]) == 0
    table = read_timings(out)
    assert len(table.rows) == 3 and all(r.median_ms > 0 for r in table.rows)
    assert table.workload.kind == "prefill" and table.space.task == "masked-lm"


def test_arm_bundle_of_an_encoder_space_holds_bidirectional_graphs(space_file, tmp_path):
    bundle = tmp_path / "b.tar.gz"
    assert main(["measure-latency", str(space_file), "--device", "arm", "--bundle", str(bundle), *QUICK]) == 0
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp_path / "board", filter="data")
    graphs = list((tmp_path / "board" / "nas-latency-bundle" / "models").glob("*.onnx"))
    flags = [f for g in graphs for f in attention_flags(g)]
    assert graphs and flags and set(flags) == {0}


def test_onnx_runtime_scores_masked_windows_as_torch_does(whole):
    """INT8 searches and exports score the ONNX model on the fitness's windows: for an encoder, per masked byte."""
    from latency.precision import ort_window_bits
    from tasks.masked_lm.learner import MaskedLM

    tokens = np.frombuffer(bytes(range(256)) * 8, dtype=np.uint8)
    held = MaskedLM(seed=0).heldout(tokens, np.array([0, 40, 300, 1000, 1500]), 32)
    torch_bits = held.window_bits(model(causal=False), None, batch_size=2, mixed_precision=False)
    ort_bits = ort_window_bits(onnx_session(whole, threads=1), held.x.numpy(), held.y.numpy(), batch_size=2)
    assert np.abs(ort_bits - torch_bits).max() < 1e-4 and 7 < ort_bits.mean() < 9  # untrained: about 8 bits


@pytest.mark.parametrize(
    "attention", ["linformer:16", "additive", "xca", "bigbird:4:2:1", "msla:3"],
)
def test_stitched_timing_graph_computes_each_encoder_type(attention, tmp_path):
    """Every encoder-only type and bidirectional form times through its own stitched part (linformer's projections
    span the sequence: the part is traced with the model's max_seq_len)."""
    layers = (LayerChoice(2, 32, attention), LayerChoice(1, 32, "softmax"))
    encoder = Transformer(TransformerConfig(256, 32, 8, "rope", 24, layers, causal=False),
                          generator=torch.Generator().manual_seed(0)).eval()
    graph, tensors = cached_graph(encoder, tmp_path)
    session = onnx_session(with_weights(graph, tensors, encoder, tmp_path / "own"), threads=1)
    for shape in [(1, 7), (2, 24)]:
        tokens = torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            expected = encoder(tokens).numpy()
        assert np.abs(session.run(None, {"input_ids": tokens.numpy()})[0] - expected).max() < 1e-4, shape

"""INT8 timing on ONNX Runtime: the stitched timing graph quantized as an export is, tables and predictors of one precision."""

from collections import Counter

import numpy as np
import onnx
import pytest
import torch

from latency.onnx_graphs import cached_graph, with_weights
from latency.quantize import calibration_feeds, quantize_model, quantized_copy
from latency.table import read_timings
from latency.timing_core import ort_session
from search_spaces import LayerChoice
from supernet.model import Transformer, TransformerConfig
from supernet.onnx_export import export_onnx

from tests.latency.latency_fakes import MICRO, micro_space

pytestmark = pytest.mark.usefixtures("graph_cache")  # a module-wide ONNX graph cache (conftest)

QUANT_OPS = ("MatMulInteger", "DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear", "MatMul", "Gather", "Mul")


def ops(path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path)).graph.node)


@pytest.mark.parametrize("precision", ["int8-dynamic", "int8-static", "int8-smooth", "int8-outlier"])
def test_a_stitched_int8_graph_is_the_whole_int8_export(tmp_path, precision):
    space = micro_space()
    layers = (LayerChoice(8, 256, "softmax"), LayerChoice(8, 256, "softmax"))
    config = TransformerConfig(space.vocab_size, space.max_seq_len, space.head_dim, space.positions, 64, layers)
    model = Transformer(config, generator=torch.Generator().manual_seed(0)).eval()
    graph, tensors = cached_graph(model)
    stitched = with_weights(graph, tensors, model, tmp_path / "stitched")  # the model's own weights in the timing graph
    whole = export_onnx(model, tmp_path / "whole" / "model.onnx")
    feeds = calibration_feeds(np.arange(400) * 7 % 64, 16, windows=3)
    a = quantize_model(stitched, tmp_path / "a.onnx", precision, feeds, max_error=None)
    b = quantize_model(whole, tmp_path / "b.onnx", precision, feeds, max_error=None)
    assert len(a.quantized) == len(b.quantized) == 2 * 6 + 1  # q, k, v, o, two FFN per layer; the tied head
    assert {op: ops(tmp_path / "a.onnx")[op] for op in QUANT_OPS} == {op: ops(tmp_path / "b.onnx")[op] for op in QUANT_OPS}
    if precision in ("int8-smooth", "int8-outlier"):  # q, k and v read one tensor: 4 + 4 + 1 inputs rewritten, not 13
        assert ops(tmp_path / "a.onnx")["DynamicQuantizeLinear"] == 2 * 4 + 1
    if precision == "int8-outlier":  # each MatMul's fp32 outlier channels: its own fp32 MatMul beside the INT8 one
        assert ops(tmp_path / "a.onnx")["Gather"] >= 2 * 4 + 1 and ops(tmp_path / "a.onnx")["MatMul"] >= 13
        assert sorted(a.outlier_channels.values()) == sorted(b.outlier_channels.values())  # (node names differ)
        assert set(a.outlier_channels.values()) == {2, 8}  # 64 / 32 inputs of width 64, 8 of the FFN's 256
    import onnxruntime as ort

    x = feeds[0]["input_ids"]
    run = {k: ort.InferenceSession(str(tmp_path / f"{k}.onnx"), providers=["CPUExecutionProvider"]).run(None, {"input_ids": x})[0]
           for k in "ab"}
    fp32 = model(torch.from_numpy(x)).detach().numpy()
    gap = np.abs(run["a"] - run["b"]).max()
    assert gap <= 1e-4 * np.abs(fp32).max() + 1e-5  # the same INT8 computation, stitched or whole
    assert np.abs(run["a"] - fp32).max() > 1e-4  # and it is not fp32


@pytest.mark.parametrize("precision", ["int8-dynamic", "int8-static", "int8-outlier"])
@pytest.mark.parametrize("workload", ["prefill", "decode"])
def test_a_timing_session_at_int8_runs_the_quantized_graph(tmp_path, precision, workload):
    from latency.devices.onnxruntime import timing_graph

    space = micro_space(decode=True)
    config = TransformerConfig.from_subnet(space, space.largest())
    with torch.device("meta"):
        model = Transformer(config)
    graph, tensors, feed = timing_graph(model, space.workload(workload))  # what the onnxruntime device times
    seen = []

    def quantize(path, folder):
        out = quantized_copy(path, folder, precision, [feed])
        seen.append(ops(out))
        return out

    q = ort_session(str(graph), tensors, threads=1, transform=quantize).run(None, feed)[0]
    f = ort_session(str(graph), tensors, threads=1).run(None, feed)[0]
    key = "QuantizeLinear" if precision == "int8-static" else "MatMulInteger"
    assert seen and seen[0][key] > 0
    assert 0 < np.abs(q - f).max() < 0.1 * np.abs(f).max()  # random weights: INT8 close to fp32, not equal


def test_measure_latency_records_the_precision_and_refuses_a_mix(tmp_path, capsys):
    from nas.cli import main

    (tmp_path / "micro.yaml").write_text(MICRO)
    args = ["measure-latency", str(tmp_path / "micro.yaml"), "--device", "onnxruntime", "--timing-threads", "1",
            "--samples", "3",
            "--out", str(tmp_path / "t.csv"), "--timing-warmup", "1", "--repeats", "2", "--rounds", "2", "--min-sample-ms", "1",
            "--retest", "0"]
    assert main(args + ["--precision", "int8-dynamic"]) == 0
    t = read_timings(tmp_path / "t.csv")
    assert len(t.passes("measure")) == 3 and t.fingerprint["precision"] == "int8-dynamic"
    assert all(r.median_ms > 0 for r in t.rows)
    capsys.readouterr()
    assert main(args + ["--precision", "int8-static"]) == 2  # another precision into the same table
    err = capsys.readouterr().err
    assert "it holds timings at precision int8-dynamic, this run measures int8-static; a table holds one precision" in err
    assert main(args) == 2  # fp32 (the default) into an INT8 table
    assert "this run measures fp32" in capsys.readouterr().err
    assert len(read_timings(tmp_path / "t.csv").rows) == 3  # nothing lost, nothing added
    cpu = ["measure-latency", str(tmp_path / "micro.yaml"), "--device", "cpu", "--out", str(tmp_path / "c.csv"),
           "--precision", "int8-static"]
    assert main(cpu) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("nas measure-latency: error: --precision int8-static: --device cpu runs fp32 only; int8-static "
                       "runs on --device onnxruntime (--provider cpu; the ARM bundle will follow)")
    assert not (tmp_path / "c.csv").exists()


def test_fit_predictor_carries_the_precision_into_the_predictor(tiny, tmp_path, capsys):
    from latency.campaign import run_campaign
    from latency.features import table_features
    from latency.predictors import load_predictor
    from latency.sampling import campaign_subnets
    from latency.table import TimingTable, make_meta
    from latency.timing_core import Settings
    from nas.cli import main

    from tests.latency.latency_fakes import FakeDevice

    class Int8Fake(FakeDevice):
        def fingerprint(self):
            return {**super().fingerprint(), "precision": "int8-static"}

    device, w = Int8Fake(), tiny.workload()
    settings = Settings(warmup=1, repeats=2, rounds=2, min_sample_ms=1.0, ref_samples=1)
    subnets = campaign_subnets(tiny, 14, seed=0)
    names = list(table_features(tiny, subnets[0], w))
    table = TimingTable(tmp_path / "t.csv", make_meta(device.fingerprint(), tiny, w, settings.to_dict(), 0, names))
    run_campaign(device, tiny, w, {"measure": subnets, "retest": []}, table, settings, seed=0)
    assert main(["fit-predictor", str(tmp_path / "t.csv"), "--out", str(tmp_path / "p")]) == 0
    assert "/ threads 1 / int8-static" in capsys.readouterr().out
    predictor = load_predictor(tmp_path / "p")
    assert predictor.precision == "int8-static" and predictor.fingerprint["precision"] == "int8-static"

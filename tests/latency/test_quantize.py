"""INT8 precisions through onnxruntime.quantization: the simulated scheme equals ONNX Runtime's, the per-layer rule."""

from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from latency.quantize import calibration_feeds, check_device, check_precision, quantize_model, simulate_matmul
from search_spaces import UserError
from supernet.quantized import (activation_range, channel_max, channel_plan, int8_linear, outlier_channels, outlier_ratio,
                                quantize_activation, quantize_weight, smooth_scales)


def two_layer_model(path, w1: np.ndarray, w2: np.ndarray | None = None):
    """x (B, T, K) -> MatMul(w1) [-> Relu -> MatMul(w2)] -> y, weights as initializers."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h" if w2 is not None else "y"], name="first")]
    if w2 is not None:
        nodes += [helper.make_node("Relu", ["h"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"], name="second")]
    last = w1 if w2 is None else w2
    graph = helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", w1.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "T", last.shape[1]])],
        [numpy_helper.from_array(w, n) for w, n in ((w1, "w1"), (w2, "w2")) if w is not None])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    return path


def run(path, x):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.fixture
def weights():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((32, 48)).astype(np.float32) * 0.1, rng.standard_normal((48, 16)).astype(np.float32) * 0.1)


def test_the_simulated_scheme_is_onnxruntimes(tmp_path, weights):
    w1, w2 = weights
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((2, 8, 32)).astype(np.float32)} for _ in range(3)]
    src = two_layer_model(tmp_path / "m.onnx", w1, w2)
    one = two_layer_model(tmp_path / "one.onnx", w1)  # the first layer alone
    x = feeds[0]["x"]
    for precision in ("int8-dynamic", "int8-static"):
        report = quantize_model(one, tmp_path / f"{precision}.onnx", precision, feeds, max_error=None)
        assert report.quantized == ["first"] and not report.kept_fp32
        got = run(tmp_path / f"{precision}.onnx", x)
        fp32, t = x @ w1, torch.from_numpy
        ranges = activation_range(t(x))
        if precision == "int8-static":  # ranges over all calibration feeds, the output quantized too
            ranges = activation_range(t(np.concatenate([f["x"].reshape(-1) for f in feeds])))
        want = quantize_activation(t(x), *ranges) @ quantize_weight(t(w1))
        if precision == "int8-static":
            want = quantize_activation(want, *activation_range(t(np.concatenate([(f["x"] @ w1).reshape(-1) for f in feeds]))))
        want = want.numpy()
        assert np.abs(got - fp32).max() > 1e-3  # it is quantized ...
        assert np.abs(got - want).max() <= 1e-5  # ... exactly the way the simulation says
    # the whole two-layer model: quantized, close to fp32
    report = quantize_model(src, tmp_path / "both.onnx", "int8-static", feeds)
    assert report.quantized == ["first", "second"] and not report.kept_fp32
    assert set(report.errors) == {"first", "second"} and max(report.errors.values()) < 0.05
    y, y32 = run(tmp_path / "both.onnx", x), run(src, x)
    assert 0 < np.abs(y - y32).max() < 0.05 * np.abs(y32).max()


def test_a_layer_with_an_outlier_channel_stays_fp32(tmp_path, weights):
    w1, w2 = weights
    w1 = w1.copy()
    w1[3, 5] = 40.0  # one outlier weight stretches the per-tensor scale: every other weight rounds to 0 or +-1 ...
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.standard_normal((2, 8, 32)).astype(np.float32)} for _ in range(3)]
    for f in feeds:
        f["x"][..., 3] = 0.0  # ... on an input channel that is silent here, so the outlier adds nothing to the output
    src = two_layer_model(tmp_path / "m.onnx", w1, w2)
    report = quantize_model(src, tmp_path / "q.onnx", "int8-dynamic", feeds, max_error=0.1)
    assert report.errors["first"] > 0.1 >= report.errors["second"]
    assert report.kept_fp32 == ["first"] and report.quantized == ["second"]
    ops = [n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node]
    assert ops.count("MatMulInteger") == 1 and ops.count("MatMul") == 1
    assert report.record()["kept_fp32"] == ["first"]
    # the error the rule reads is the simulated one on the node's own fp32 inputs
    inputs = [f["x"] for f in feeds]
    assert report.errors["first"] == pytest.approx(simulate_matmul(inputs, w1, "int8-dynamic"))


def shared_input_model(path, w1: np.ndarray, w2: np.ndarray):
    """x -> MatMul(w1) and x -> MatMul(w2) (two layers reading one tensor, as Q, K and V do), y = the sum."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="first"),
             helper.make_node("MatMul", ["x", "w2"], ["b"], name="second"), helper.make_node("Add", ["a", "b"], ["y"])]
    graph = helper.make_graph(
        nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", w1.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "T", w1.shape[1]])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    return path


def outlier_feeds(seed: int, k: int = 32, channel: int = 7, gain: float = 60.0) -> list[dict]:
    """Three calibration inputs (2, 8, k) whose ``channel`` is ``gain`` times larger than the rest (LayerNorm's gain
    on one feature, as in BERT)."""
    rng = np.random.default_rng(seed)
    feeds = [{"x": rng.standard_normal((2, 8, k)).astype(np.float32)} for _ in range(3)]
    for f in feeds:
        f["x"][..., channel] *= gain
    return feeds


def test_the_per_channel_statistics_and_steps():
    x = torch.ones(2, 3, 8)
    x[1, 2, 5] = -40.0
    assert channel_max(x).tolist() == [1.0] * 5 + [40.0] + [1.0] * 2
    assert outlier_ratio(channel_max(x)) == 40.0
    assert outlier_channels(channel_max(x)).tolist() == [5]  # ceil(8 / 32) = 1 channel
    assert outlier_channels(torch.arange(64.0)).tolist() == [62, 63]  # 2 of 64
    assert outlier_channels(torch.ones(8)).tolist() == [0]  # ties: the lower channel
    s = smooth_scales(torch.tensor([16.0, 1.0, 0.0]), torch.tensor([1.0, 4.0, 1.0]))
    assert s.tolist() == pytest.approx([4.0, 0.5, 1e-5**0.5])  # sqrt(act / weight), a silent channel floored
    # Q and K read one tensor: one scale, over both layers' weights
    plan = channel_plan("int8-smooth", [torch.tensor([4.0, 1.0]), torch.tensor([4.0, 1.0]), torch.tensor([9.0, 9.0])],
                        [torch.tensor([1.0, 1.0]), torch.tensor([4.0, 1.0]), torch.tensor([1.0, 1.0])], [0, 0, 2])
    assert plan[0]["smooth"].tolist() == plan[1]["smooth"].tolist() == pytest.approx([1.0, 1.0])
    assert plan[2]["smooth"].tolist() == pytest.approx([3.0, 3.0])


def test_the_outlier_aware_precisions_are_the_simulated_scheme_and_lose_less(tmp_path, weights):
    w1, _ = weights
    feeds = outlier_feeds(3)
    one = two_layer_model(tmp_path / "one.onnx", w1)
    x, t = feeds[0]["x"], torch.from_numpy
    act = torch.stack([channel_max(t(f["x"])) for f in feeds]).amax(0)
    err = {}
    for precision in ("int8-dynamic", "int8-smooth", "int8-outlier"):
        report = quantize_model(one, tmp_path / f"{precision}.onnx", precision, feeds, max_error=None)
        assert report.quantized == ["first"]
        got = run(tmp_path / f"{precision}.onnx", x)
        steps = channel_plan(precision, [act], [channel_max(t(w1.T.copy()))], [0])[0] if precision != "int8-dynamic" else {}
        want = int8_linear(t(x), t(w1.T.copy()), None, **steps).numpy()
        assert np.abs(got - want).max() <= 1e-5  # ONNX Runtime computes what the simulation says
        err[precision] = float(np.abs(got - x @ w1).max())
        ops = Counter(n.op_type for n in onnx.load(str(tmp_path / f"{precision}.onnx")).graph.node)
        assert ops["MatMulInteger"] == 1
        if precision == "int8-outlier":  # channel 7 in fp32 beside the INT8 product
            assert steps["outliers"].tolist() == [7] and ops["Gather"] == 1 and ops["MatMul"] == 1 and ops["Add"] == 1
            assert report.record()["outlier_channels"] == {"first": 1} and "LLM.int8" in report.record()["scheme"]
        if precision == "int8-smooth":
            assert "SmoothQuant (alpha 0.5" in report.record()["scheme"] and "outlier_channels" not in report.record()
    assert err["int8-smooth"] < 0.5 * err["int8-dynamic"] and err["int8-outlier"] < 0.5 * err["int8-dynamic"]


def test_layers_reading_one_tensor_share_the_smoothing_and_the_outlier_split(tmp_path, weights):
    w1, _ = weights
    w2 = np.random.default_rng(4).standard_normal((32, 48)).astype(np.float32) * 0.1
    feeds = outlier_feeds(5)
    src = shared_input_model(tmp_path / "m.onnx", w1, w2)
    x = feeds[0]["x"]
    for precision, shared in (("int8-smooth", {"Mul": 1}), ("int8-outlier", {"Mul": 1, "Gather": 1})):
        report = quantize_model(src, tmp_path / "q.onnx", precision, feeds, max_error=0.1)
        assert report.quantized == ["first", "second"] and not report.kept_fp32
        model = onnx.load(str(tmp_path / "q.onnx"))
        ops = Counter(n.op_type for n in model.graph.node)
        # one Mul (and Gather) on x, one DynamicQuantizeLinear of its output for both MatMuls; DynamicQuantizeLinear's
        # scale Mul per MatMul comes from ONNX Runtime's quantizer
        assert sum(1 for n in model.graph.node if n.op_type in shared and "x" in n.input) == sum(shared.values())
        assert ops["DynamicQuantizeLinear"] == 1 and ops["MatMulInteger"] == 2
        assert {i.name for i in model.graph.initializer}.isdisjoint({"w1", "w2"})  # the originals, no longer read
        y = run(tmp_path / "q.onnx", x)
        assert np.abs(y - run(src, x)).max() < 0.05 * np.abs(run(src, x)).max()


def test_bad_input_lines():
    with pytest.raises(UserError, match=r"^--precision: 'int4' is not one of fp32, int8-dynamic, int8-static, "
                                        r"int8-smooth, int8-outlier$"):
        check_precision("int4")
    assert check_precision(None) == "fp32"
    with pytest.raises(UserError, match=r"^--precision int8-static: --device cpu runs fp32 only; int8-static runs on "
                                        r"--device onnxruntime \(--provider cpu"):
        check_device("int8-static", "cpu")
    with pytest.raises(UserError, match=r"--device onnxruntime --provider cuda runs fp32 only"):
        check_device("int8-dynamic", "onnxruntime", "cuda")
    check_device("int8-dynamic", "onnxruntime", "cpu")
    check_device("fp32", "cuda")
    with pytest.raises(UserError, match=r"^validation tokens: 100 tokens are too short to calibrate the workload: one "
                                        r"calibration input is 1 x 256 tokens"):
        calibration_feeds(np.zeros(100, dtype=np.uint8), 256, where="validation tokens")
    feeds = calibration_feeds(np.arange(1000) % 256, 64, windows=3, seed=5)
    assert [f["input_ids"].shape for f in feeds] == [(1, 64)] * 3
    again = calibration_feeds(np.arange(1000) % 256, 64, 3, 5)
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(feeds, again))

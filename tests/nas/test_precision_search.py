"""Search at a precision: the torch INT8 estimate, its agreement with ONNX Runtime's real INT8 model, the CLI's checks."""

import json

import numpy as np
import pytest

from nas.cli import main
from latency.precision import agreement
from nas.search import InheritedLoss
from search_spaces import Subnet
from supernet import extract
from supernet.quantized import Simulated, calibrate

from tests.nas.search.test_search_fitness import FakePredictor, run_dir, search_args, supernet  # noqa: F401 (fixtures)

TEXT = b"def f(x):\n    return x * 2\n" * 20 + b"import os\nprint(os.getcwd(), sorted(os.listdir('.')))\n" * 20


@pytest.mark.parametrize("precision", ["int8-dynamic", "int8-static", "int8-smooth", "int8-outlier"])
def test_the_estimate_scores_the_supernet_as_the_simulated_static_model(supernet, precision):  # noqa: F811
    tokens = np.frombuffer(TEXT, dtype=np.uint8)
    subnet = Subnet(96, 2, (2, 4), (256, 128), ("softmax", "linear"))
    fit = InheritedLoss(supernet, tokens, seq_len=32, windows=4, batch_size=2, precision=precision)
    fp32 = InheritedLoss(supernet, tokens, seq_len=32, windows=4, batch_size=2)([subnet])[0]
    est = fit([subnet])[0]
    assert fit.description["precision"] == precision and est != fp32 and abs(est - fp32) < 0.05
    static = extract(supernet, subnet).eval()  # the same simulation on the extracted static model: the same number
    plan = calibrate(static, fit.calibration, precision, fit.max_error)
    assert len(plan.errors) == 2 * 6 + 1 and not plan.fp32  # q, k, v, o, fc1, fc2 per layer, the tied head
    bits = fit.heldout.bits(Simulated(static, plan), None, 2, mixed_precision=False)
    assert bits == pytest.approx(est, abs=1e-6)


def test_the_estimate_agrees_with_onnxruntimes_int8_model(supernet, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("NAS_CACHE", str(tmp_path / "cache"))
    tokens = np.frombuffer(TEXT, dtype=np.uint8)
    subnets = [Subnet(64, 1, (2,), (128,), ("softmax",)), Subnet(96, 2, (4, 1), (512, 128), ("softmax", "softmax")),
               Subnet(128, 1, (1,), (256,), ("softmax",))]
    for precision in ("int8-dynamic", "int8-static", "int8-smooth", "int8-outlier"):
        fit = InheritedLoss(supernet, tokens, seq_len=32, windows=4, batch_size=2, precision=precision)
        a = agreement(supernet, fit, subnets)
        gap, effect = np.abs(a.estimate - a.real), np.abs(a.real - a.fp32)
        assert effect.min() > 0  # ONNX Runtime's INT8 model is not fp32 ...
        assert gap.mean() < 0.5 * effect.mean(), (precision, a.summary())  # ... and the estimate predicts where it lands
        assert a.summary()["subnets"] == 3 and 0 <= a.mean_abs_diff == pytest.approx(gap.mean())
    # a supernet with an outlier feature (LayerNorm's gain on one channel, as in BERT): the outlier-aware estimates still
    # land on ONNX Runtime's models, and INT8 moves them less than plain dynamic INT8 does
    import copy

    import torch

    from supernet.quantized import channel_maxima, outlier_ratio

    loud = copy.deepcopy(supernet)
    with torch.no_grad():
        for name, p in loud.named_parameters():
            if name.endswith(("ln1.weight", "ln2.weight", "ln_f.weight")):
                p[5] = 25.0
    x = torch.from_numpy(np.frombuffer(TEXT[:64], dtype=np.uint8).astype(np.int64))[None]
    assert outlier_ratio(channel_maxima(lambda t: loud(t, subnets[0]), [x])[0]) > 10  # q's input: channel 5
    moved = {}
    for precision in ("int8-dynamic", "int8-smooth", "int8-outlier"):
        fit = InheritedLoss(loud, tokens, seq_len=32, windows=4, batch_size=2, precision=precision)
        a = agreement(loud, fit, subnets[:2])
        assert np.abs(a.estimate - a.real).max() < 1e-4, (precision, a.summary())
        moved[precision] = np.abs(a.real - a.fp32).mean()
    assert max(moved["int8-smooth"], moved["int8-outlier"]) < 0.5 * moved["int8-dynamic"], moved


def test_search_at_int8_scores_int8_and_refuses_a_predictor_of_another_precision(run_dir, capsys, tiny):  # noqa: F811
    tmp, ckpt, spaces = run_dir
    assert main(search_args(tmp, ckpt, "--budget", "6ms", "--precision", "int8-dynamic")) == 2
    assert capsys.readouterr().err.strip() == (
        f"nas search: error: --predictor {tmp / 'pred.json'}: fitted on timings at precision fp32, but --precision is "
        "int8-dynamic; measure at int8-dynamic (nas measure-latency --device onnxruntime --precision int8-dynamic) "
        "and fit a predictor on them")
    assert not (tmp / "out" / "search.json").exists()
    spaces["pred.json"].fingerprint["precision"] = "int8-dynamic"
    assert main(search_args(tmp, ckpt, "--budget", "6ms")) == 2  # an INT8 predictor in an fp32 search
    assert "fitted on timings at precision int8-dynamic, but --precision is fp32" in capsys.readouterr().err
    assert main(search_args(tmp, ckpt, "--budget", "6ms", "--precision", "int8-dynamic", "--generations", "1")) == 0
    summary = json.loads((tmp / "out" / "search.json").read_text())
    best = Subnet.load(tmp / "out" / "best_6ms.yaml")
    tokens = np.fromfile(tmp / "val.txt", dtype=np.uint8)
    int8 = InheritedLoss(supernet_of(ckpt), tokens, seq_len=32, windows=2, precision="int8-dynamic")([best])[0]
    fp32 = InheritedLoss(supernet_of(ckpt), tokens, seq_len=32, windows=2)([best])[0]
    assert summary["budgets"]["6ms"]["best"]["loss_bpb"] == pytest.approx(int8, abs=1e-9) and int8 != fp32
    assert main(search_args(tmp, ckpt, "--budget", "6ms", "--precision", "int4")) == 2
    assert capsys.readouterr().err.strip().endswith("--precision: 'int4' is not one of fp32, int8-dynamic, int8-static, "
                                                    "int8-smooth, int8-outlier")


def supernet_of(ckpt):
    from supernet.checkpoint import load_supernet

    return load_supernet(ckpt)[0]


FAST = ["--timing-threads", "1", "--timing-warmup", "1", "--repeats", "2", "--rounds", "1", "--min-sample-ms", "1"]


def export_args(model, tmp_path, subnet: Subnet, windows: int, seq_len: int) -> list[str]:
    """``nas export`` of ``subnet`` (ONNX only) from a checkpoint of the supernet ``model``, scored on TEXT, to tmp_path/o."""
    from supernet.checkpoint import save_checkpoint

    ckpt = save_checkpoint(tmp_path / "ck.pt", model, {}, step=3)
    (tmp_path / "s.yaml").write_text(subnet.to_yaml())
    (tmp_path / "val.txt").write_bytes(TEXT)
    return ["export", str(ckpt), "--subnet", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o"),
            "--format", "onnx", "--val-data", str(tmp_path / "val.txt"), "--val-windows", str(windows), "--seq-len", str(seq_len)]


def test_export_at_int8_writes_the_quantized_onnx_scores_both_and_times_it(supernet, tmp_path, capsys):  # noqa: F811
    from collections import Counter

    import onnx

    from supernet.artifact import read_card

    out = tmp_path / "o"
    args = export_args(supernet, tmp_path, Subnet(96, 2, (2, 4), (256, 128), ("softmax", "local:32")), 4, 32)
    args += ["--precision", "int8-static"]
    assert main(args + ["--timing-target", "cpu"]) == 2  # torch cannot run it: refused before anything is written
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "nas export: error: --precision int8-static: --timing-target cpu runs fp32 only; int8-static runs on "
        "--timing-target onnxruntime (--provider cpu; the ARM bundle will follow)")
    assert not out.exists()
    assert main(args + ["--timing-target", "onnxruntime", *FAST]) == 0
    printed = capsys.readouterr().out
    card = read_card(out)
    q = card["quantized"]
    assert q["file"] == "model.int8-static.onnx" and q["file"] in card["files"] and q["precision"] == "int8-static"
    assert q["quantized_matmuls"] == 2 * 6 + 1 and q["kept_fp32"] == [] and len(q["errors"]) == 13
    ops = Counter(n.op_type for n in onnx.load(str(out / q["file"])).graph.node)
    assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > 0
    b = q["bits_per_byte"]
    assert b["fp32_onnxruntime"] == pytest.approx(card["validation"]["bits_per_byte"], abs=1e-4)  # ORT fp32 == torch fp32
    assert b["int8_onnxruntime"] != b["fp32_onnxruntime"]
    assert abs(b["int8_torch_estimate"] - b["int8_onnxruntime"]) < 2e-3  # the search's estimate of this very file
    assert card["measured"]["timed"] == "model.int8-static.onnx"
    int8 = out / "model.int8-static.onnx"
    assert f"  int8-static       {int8}  (13 MatMuls INT8, 0 kept fp32 by the 0.1 error rule)" in printed
    assert "on onnxruntime, model.int8-static.onnx, prefill" in printed


def test_export_at_int8_times_a_decode_workload_on_the_quantized_step_graph(supernet, tmp_path, capsys):  # noqa: F811
    from supernet.artifact import read_card
    from supernet.onnx_decode import onnx_decode_logits
    from supernet.onnx_export import onnx_session

    out = tmp_path / "o"
    args = export_args(supernet, tmp_path, Subnet(64, 2, (2, 1), (128, 128), ("softmax", "linear")), 2, 16)
    args += ["--no-eval", "--precision", "int8-dynamic", "--timing-target", "onnxruntime", "--workload", "decode"]
    assert main(args + FAST) == 0
    card = read_card(out)
    step = card["quantized_step"]
    assert step["file"] == "step.int8-dynamic.onnx" and step["file"] in card["files"] and "step.onnx" in card["files"]
    assert step["quantized_matmuls"] == 2 * 6 + 1 and step["calibration"]["steps"] > 0
    assert card["measured"]["timed"] == "step.int8-dynamic.onnx"
    x = np.frombuffer(TEXT[:12], dtype=np.uint8).astype(np.int64)[None]  # (1, 12)
    q = onnx_decode_logits(onnx_session(out / step["file"]), x)  # the layout travels with the quantized graph
    f = onnx_decode_logits(onnx_session(out / "step.onnx"), x)
    assert 0 < np.abs(q - f).max() < 0.05 * np.abs(f).max()


def test_export_at_int8_outlier_writes_the_decomposed_onnx_and_the_estimate_lands_on_it(supernet, tmp_path, capsys):  # noqa: F811
    from collections import Counter

    import onnx

    from supernet.artifact import read_card

    out = tmp_path / "o"
    args = export_args(supernet, tmp_path, Subnet(64, 1, (2,), (128,), ("softmax",)), 4, 32)
    assert main(args + ["--precision", "int8-outlier", "--timing-target", "onnxruntime", *FAST]) == 0
    card = read_card(out)
    q = card["quantized"]
    assert q["file"] == "model.int8-outlier.onnx" and q["file"] in card["files"] and q["precision"] == "int8-outlier"
    assert q["quantized_matmuls"] == 6 + 1 and "LLM.int8" in q["scheme"]
    assert sorted(q["outlier_channels"].values()) == [2] * 6 + [4]  # 1/32 of 64 inputs, 4 of the FFN's 128
    ops = Counter(n.op_type for n in onnx.load(str(out / q["file"])).graph.node)
    gathers = [n for n in onnx.load(str(out / q["file"])).graph.node if n.op_type == "Gather" and "outliers" in n.name]
    assert ops["MatMulInteger"] == 7 and len(gathers) == 5  # q, k and v read one tensor: 5 distinct inputs of 7 MatMuls
    b = q["bits_per_byte"]
    assert b["fp32_onnxruntime"] == pytest.approx(card["validation"]["bits_per_byte"], abs=1e-4)
    assert b["int8_onnxruntime"] != b["fp32_onnxruntime"]
    assert abs(b["int8_torch_estimate"] - b["int8_onnxruntime"]) < 1e-4  # the search's estimate of this very file
    assert card["measured"]["timed"] == "model.int8-outlier.onnx"
    assert "  int8-outlier      " in capsys.readouterr().out

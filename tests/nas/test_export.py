import json

import pytest
import torch

from nas.cli import main
from supernet.export import choose_opset
from tasks.stack.export import export_subnet
from search_spaces import Subnet, UserError
from supernet import SuperTransformer, extract, load_model
from supernet.artifact import read_card
from supernet.checkpoint import save_checkpoint
from supernet.generate import generate

SUBNET = Subnet(96, 3, (4, 2, 1), (512, 256, 128), ("softmax", "local:32", "linear"))


@pytest.fixture(scope="module")
def supernet(tiny):
    return SuperTransformer(tiny, generator=torch.Generator().manual_seed(0)).eval()


@pytest.fixture(scope="module")
def exported(supernet, tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    return export_subnet(supernet, SUBNET, out, card={"note": "test"})


def test_export_writes_a_parity_checked_onnx_with_fused_attention(exported):
    assert exported.opset == 23 and not exported.notes
    assert exported.attention_nodes == 1  # softmax's; local exports block-local MatMul / Softmax nodes
    assert exported.parity <= 1e-4
    card = read_card(exported.out)
    assert card["onnx"]["parity_max_abs"] == exported.parity
    assert set(card["files"]) == {"model.safetensors", "model.onnx", "model.pt2", "tokenizer.json"}  # issue 54: its vocabulary
    assert card["note"] == "test" and card["parameters"] == exported.parameters


def test_loader_round_trip(supernet, exported):
    model = load_model(exported.out)
    assert model.subnet == SUBNET and model.num_params() == exported.parameters
    x = torch.randint(0, 256, (2, 64))
    with torch.no_grad():
        assert torch.equal(model(x), extract(supernet, SUBNET).eval()(x))
        assert (model(x) - supernet(x, SUBNET)).abs().max() <= 1e-5
    assert Subnet.load(exported.out / "subnet.yaml") == SUBNET


def test_tampered_files_are_refused(exported, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(exported.out, bad)
    data = bytearray((bad / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (bad / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"model.safetensors: checksum .* does not match the model card"):
        load_model(bad)
    card = json.loads((bad / "model_card.json").read_text())
    card["format"] = "something-else"
    (bad / "model_card.json").write_text(json.dumps(card))
    with pytest.raises(UserError, match="not a model card of this tool"):
        load_model(bad)
    (bad / "model_card.json").write_text("{")
    with pytest.raises(UserError, match="model_card.json: not valid JSON"):
        load_model(bad)
    with pytest.raises(UserError, match="is not a model exported by `nas export`"):
        load_model(tmp_path)


def test_parity_failure_stops_the_export(supernet, tmp_path, monkeypatch):
    import tasks.stack.export as stack_export

    monkeypatch.setattr(stack_export, "onnx_parity", lambda *a, **k: 0.5)
    with pytest.raises(UserError, match=r"differs from torch by 0.5 .* over the 0.0001 limit"):
        export_subnet(supernet, SUBNET, tmp_path / "x", formats=("onnx",))
    assert not (tmp_path / "x" / "model.onnx").exists()


def test_old_onnxruntime_falls_back_with_a_note(supernet, tmp_path):
    assert choose_opset("1.24.1") == (23, [])
    opset, notes = choose_opset("1.20")
    assert opset == 18 and "older than 1.23" in notes[0]
    with pytest.raises(UserError, match="too old"):
        choose_opset("1.10")
    with pytest.raises(UserError, match="not a version"):
        choose_opset("latest")
    result = export_subnet(
        supernet, Subnet(64, 1, (2,), (128,), ("softmax",)), tmp_path / "old", target_ort="1.20", formats=("onnx",)
    )
    assert result.opset == 18 and result.attention_nodes == 0 and result.parity <= 1e-4


def test_generate_is_seeded(exported):
    model = load_model(exported.out)
    a = generate(model, b"def ", 20, generator=torch.Generator().manual_seed(1))
    b = generate(model, b"def ", 20, generator=torch.Generator().manual_seed(1))
    assert a == b and len(a) == 20
    greedy = generate(model, b"x", 5, temperature=0)
    x = torch.tensor([list(b"x")])
    with torch.no_grad():
        assert greedy[0] == int(model(x)[0, -1].argmax())


def test_export_cli(supernet, tmp_path, capsys):
    ckpt = save_checkpoint(tmp_path / "ck.pt", supernet, {}, step=3)
    (tmp_path / "s.yaml").write_text(SUBNET.to_yaml())
    assert (
        main(
            [
                "export",
                str(ckpt),
                "--subnet",
                str(tmp_path / "s.yaml"),
                "--out",
                str(tmp_path / "o"),
                "--format",
                "torch",
                "--no-eval",
            ]
        )
        == 0
    )
    assert "parameters" in capsys.readouterr().out
    assert not (tmp_path / "o" / "model.onnx").exists() and (tmp_path / "o" / "model.safetensors").exists()
    assert (
        main(
            [
                "export",
                str(ckpt),
                "--subnet",
                str(tmp_path / "s.yaml"),
                "--out",
                str(tmp_path / "o"),
                "--format",
                "tflite",
            ]
        )
        == 2
    )
    assert "--format: 'tflite'" in capsys.readouterr().err
    (tmp_path / "big.yaml").write_text(Subnet(256, 1, (1,), (128,), ("softmax",)).to_yaml())
    assert main(["export", str(ckpt), "--subnet", str(tmp_path / "big.yaml"), "--out", str(tmp_path / "o2")]) == 2
    assert "embed_dim: 256 is not one of 64, 96, 128" in capsys.readouterr().err
    assert main(["generate", "--model", str(tmp_path / "o"), "--prompt", "ab", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("ab")


# --------------------------------------------------------------------------- torch.export program


ALL_TYPES = ["softmax", "gqa:2", "local:32", "dilated:8:2", "strided:16", "fixed:16", "longformer:16:4", "bigbird:16:2:1",
             "linear", "relu-linear", "cosformer:64", "performer:16"]


def static_model(types, seed=0):
    from supernet import Transformer, TransformerConfig

    n = len(types)
    sub = Subnet(64, n, (2,) * n, (128,) * n, tuple(types))
    return Transformer(
        TransformerConfig(256, 256, 32, "rope", 64, sub.layers), generator=torch.Generator().manual_seed(seed)
    ).eval()


@pytest.mark.parametrize("types", [ALL_TYPES[0:4], ALL_TYPES[4:8], ALL_TYPES[8:12]], ids=["dense", "sparse", "linear"])
def test_torch_export_program_round_trip_every_attention_type(types, tmp_path):
    from tasks.stack.export import program_parity
    from supernet.artifact import check_program, export_program

    model = static_model(types)
    path = export_program(model, tmp_path / "model.pt2")
    check_program(path)
    program = torch.export.load(str(path)).module()  # plain torch: no nas code in the loop
    gap = program_parity(program, model, (5, 100, 256))  # (1, 5), (3, 100), (3, 256): lengths below and above a chunk
    assert gap <= 1e-5, f"{types}: {gap}"


def test_program_in_the_export_and_its_refusals(exported, tmp_path):
    import shutil
    import zipfile

    from supernet.artifact import load_program

    card = read_card(exported.out)
    assert card["torch_program"]["parity_max_abs"] <= 1e-5 and "model.pt2" in card["files"]
    program = load_program(exported.out)
    x = torch.randint(0, 256, (2, 33))
    with torch.no_grad():
        assert (program(x) - load_model(exported.out)(x)).abs().max() <= 1e-5
    bad = tmp_path / "bad"
    shutil.copytree(exported.out, bad)
    # An archive whose weights would be unpickled (torch.export.load uses weights_only=False for them) is refused,
    # even with a matching checksum in the card.
    with zipfile.ZipFile(exported.out / "model.pt2") as src, zipfile.ZipFile(bad / "model.pt2", "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("_weights_config.json"):
                data = data.replace(b'"use_pickle": false', b'"use_pickle": true', 1)
            dst.writestr(item, data)
    from supernet.artifact import update_card

    update_card(bad, files=["model.pt2"])
    with pytest.raises(UserError, match=r"model.pt2: holds pickled entries .* could run code, refused"):
        load_program(bad)
    (bad / "model.pt2").write_bytes(b"not a zip")
    with pytest.raises(UserError, match=r"model.pt2: checksum .* does not match the model card"):
        load_program(bad)


# --------------------------------------------------------------------------- card: bits per byte, predicted and measured latency


def fake_predictor(space, path, device="fake"):
    """An additive predictor fitted on the fake device's cost (0.2 ms + 1 ns per parameter per 16 tokens)."""
    import numpy as np

    from latency.predictors import Predictor
    from latency.predictors.additive import Additive
    from latency.predictors.predictor import subnet_matrix

    rng = np.random.default_rng(0)
    subnets = [space.sample(rng) for _ in range(60)]
    supernet = SuperTransformer(space)
    w = space.workload()
    ms = np.array([0.2 + 1e-6 * supernet.num_params(s) * w.seq_len / 16 for s in subnets])
    x, _ = subnet_matrix("additive", space, w, subnets)
    Predictor("additive", Additive().fit(x, ms), space, w, {"device": device}).save(path)
    return path


class SlowFakeDevice:
    """tests.latency.latency_fakes.FakeDevice, 'slow' times slower for models of the given widths."""

    def __new__(cls, slow_widths=(), factor=1.0):
        from tests.latency.latency_fakes import FakeDevice

        class Slow(FakeDevice):
            def prepare(self, model, workload):
                run = super().prepare(model, workload)
                if model.config.embed_dim in slow_widths and len(model.config.layers) != 2:  # not the reference (2 layers)
                    return lambda n: run(n) * factor  # noqa: E731
                return run

        return Slow()


def test_export_cli_card_bpb_predicted_and_measured(supernet, tmp_path, capsys, monkeypatch):
    import latency.device

    ckpt = save_checkpoint(tmp_path / "ck.pt", supernet, {}, step=3)
    (tmp_path / "s.yaml").write_text(SUBNET.to_yaml())
    (tmp_path / "val.txt").write_bytes(bytes(range(256)) * 8)
    pred = fake_predictor(supernet.space, tmp_path / "pred")
    monkeypatch.setattr(latency.device, "get_device", lambda name, **kw: SlowFakeDevice((96,), factor=1000.0))
    out = tmp_path / "o"
    args = ["export", str(ckpt), "--subnet", str(tmp_path / "s.yaml"), "--out", str(out), "--format", "torch",
            "--val-data", str(tmp_path / "val.txt"), "--val-windows", "4", "--seq-len", "64", "--predictor", str(pred),
            "--timing-target", "fake", "--budget", "50ms", "--repeats", "4", "--rounds", "2", "--timing-warmup", "1"]
    assert main(args) == 0  # over budget: a warning, exit 0 without --strict
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and warnings[0].startswith("nas export: warning: ") and "over the budget 50ms" in warnings[0]
    card = read_card(out)
    from supernet.scoring import Scoring, validation_bpb
    from nas.search.fitness import InheritedLoss

    import numpy as np

    tokens = np.frombuffer((tmp_path / "val.txt").read_bytes(), dtype=np.uint8)
    search_score = InheritedLoss(supernet, tokens, seq_len=64, windows=4)([SUBNET])[0]  # what nas search reports
    assert card["validation"]["bits_per_byte"] == pytest.approx(search_score, abs=1e-5)
    assert card["validation"]["bits_per_byte"] == pytest.approx(
        validation_bpb(load_model(out), supernet.space, tokens, Scoring(windows=4, seq_len=64))["bits_per_byte"], abs=1e-9)
    params = card["parameters"]
    fake_ms = (0.2 + 1e-6 * params * 256 / 16) * 1000  # 1000 x slower than the predictor's fake device
    m = card["measured"]
    assert m["median_ms"] == pytest.approx(fake_ms, rel=1e-6) and m["over_budget"] and m["budget_ms"] == 50.0
    assert m["predicted_ms"] == card["latency"]["predicted_ms"] and card["latency"]["workload"]["name"] == "prefill"
    # one sign everywhere: (measured - predicted) / predicted; the device is 1000x slower than predicted, so about +99900%
    assert m["error_pct"] == pytest.approx(100 * (m["median_ms"] - m["predicted_ms"]) / m["predicted_ms"]) and m["error_pct"] > 0
    assert f"prediction error {m['error_pct']:+.1f}%" in captured.out and m["error_pct"] == pytest.approx(99900, rel=0.01)
    assert f"{m['median_ms']:.3f} ms" in captured.out and "OVER" in captured.out
    assert main(args + ["--strict", "-q"]) == 1
    quiet = capsys.readouterr().err.splitlines()  # -q: no notes, no progress bars; the warning stays
    assert len(quiet) == 1 and quiet[0].startswith("nas export: warning: measured latency") and "over the budget 50ms" in quiet[0]
    no_measure = [a for a in args if a not in ("--timing-target", "fake")]
    assert main(no_measure) == 2 and "--budget: needs --timing-target" in capsys.readouterr().err
    assert main(args + ["--workload", "decode"]) == 2
    assert "workload" in capsys.readouterr().err


def test_measure_times_the_exported_onnx_file(exported):
    from latency.device import get_device
    from latency.timing_core import Settings
    from latency.measure import measure_model
    from search_spaces import Workload

    model = load_model(exported.out)
    fast = Settings(warmup=1, repeats=2, rounds=1, min_sample_ms=1.0)
    m = measure_model(get_device("onnxruntime", threads=1), model, Workload("prefill", 1, 64), fast, onnx_path=exported.onnx_path)
    assert m["timed"] == "model.onnx" and m["median_ms"] > 0 and m["predicted_ms"] is None



def test_export_measure_times_the_decode_step_at_the_workloads_context(supernet, tiny, tmp_path, capsys, monkeypatch):
    """--workload decode on onnxruntime: the decode step graph is timed on one new token with 255 tokens seen
    (not model.onnx on a (1, 0) batch), and the printed line names the context."""
    from latency.devices.onnxruntime import OnnxRuntime
    from supernet.onnx_export import onnx_session

    fed = []
    real = OnnxRuntime.prepare_file

    def recording(self, path, feed):  # the exported file's runner (the reference goes through the device's prepare)
        fed.append(({i.name for i in onnx_session(path).get_inputs()}, {k: v.copy() for k, v in feed.items()}))
        return real(self, path, feed)

    monkeypatch.setattr(OnnxRuntime, "prepare_file", recording)
    ckpt = save_checkpoint(tmp_path / "ck.pt", supernet, {}, step=3)
    (tmp_path / "s.yaml").write_text(SUBNET.to_yaml())
    out = tmp_path / "o"
    assert main(["export", str(ckpt), "--subnet", str(tmp_path / "s.yaml"), "--out", str(out), "--format", "onnx",
                 "--no-eval", "--timing-target", "onnxruntime", "--workload", "decode", "--timing-threads", "1",
                 "--timing-warmup", "1", "--repeats", "2", "--rounds", "1", "--min-sample-ms", "1"]) == 0
    printed = capsys.readouterr().out
    assert len(fed) == 1  # the exported model, from its file; the reference goes through the device
    names, feed = fed[0]
    context = tiny.workload("decode").context
    assert "tokens" not in names and {"input_ids", "position"} <= names == set(feed)
    assert feed["input_ids"].shape == (1, 1) and feed["position"].tolist() == [context]
    # layer 0: softmax, a growing cache (optimum's name); layers 1 and 2 (local window, linear) keep other states
    assert feed["past_key_values.0.key"].shape == (1, SUBNET.heads[0], context, tiny.head_dim)
    assert all(a.shape[0] == 1 for name, a in feed.items() if name.startswith("past"))
    card = read_card(out)
    m = card["measured"]
    assert m["timed"] == "step.onnx" and m["workload"]["kind"] == "decode" and m["workload"]["context"] == context
    assert "step.onnx" in card["files"] and card["decode_step"]["parity_max_abs"] <= 1e-4
    measured = [line for line in printed.splitlines() if line.strip().startswith("measured")]
    assert len(measured) == 1 and f"on onnxruntime, step.onnx, decode 1x1@{context}" in measured[0] and "seq_len" not in printed


def test_check_export_script_prints_the_done_when_figures(supernet, tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("check_export", Path(__file__).parents[2] / "scripts" / "check_export.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    ckpt = save_checkpoint(tmp_path / "ck.pt", supernet, {}, step=3)
    sub = Subnet(64, 2, (2, 1), (128, 128), ("softmax", "linear"))
    (tmp_path / "s.yaml").write_text(sub.to_yaml())
    pred = fake_predictor(supernet.space, tmp_path / "pred", device="onnxruntime")
    code = script.main(["--supernet", str(ckpt), "--subnet", str(tmp_path / "s.yaml"), "--predictor", str(pred),
                        "--out", str(tmp_path / "o"), "--threads", "1", "--warmup", "1", "--repeats", "2", "--rounds", "1",
                        "--min-sample-ms", "1"])
    out = capsys.readouterr().out
    assert "fused attention   1 ONNX Attention nodes for 1 softmax-family layers (opset 23): OK" in out
    assert "parity            max |onnxruntime - torch|" in out and "model.onnx" in out
    assert code in (0, 1) and ("within" in out or "OUTSIDE" in out)

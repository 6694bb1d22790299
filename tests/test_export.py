import json

import pytest
import torch

from nas.cli import main
from nas.export import choose_opset, export_subnet
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
    assert exported.attention_nodes == 2  # one per softmax-family layer (softmax, local)
    assert exported.parity <= 1e-4
    card = read_card(exported.out)
    assert card["onnx"]["parity_max_abs"] == exported.parity
    assert set(card["files"]) == {"model.safetensors", "model.onnx"}
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
    import supernet.onnx_export as ox

    monkeypatch.setattr(ox, "onnx_parity", lambda *a, **k: 0.5)
    with pytest.raises(UserError, match=r"differs from torch by 0.5 .* over the 0.0001 limit"):
        export_subnet(supernet, SUBNET, tmp_path / "x")
    assert not (tmp_path / "x" / "model.onnx").exists()


def test_old_onnxruntime_falls_back_with_a_note(supernet, tmp_path):
    assert choose_opset("1.24.1") == (23, [])
    opset, notes = choose_opset("1.20")
    assert opset == 18 and "older than 1.23" in notes[0]
    with pytest.raises(UserError, match="too old"):
        choose_opset("1.10")
    with pytest.raises(UserError, match="not a version"):
        choose_opset("latest")
    result = export_subnet(supernet, Subnet(64, 1, (2,), (128,), ("softmax",)), tmp_path / "old", target_ort="1.20")
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
    assert main(["export", "--supernet", str(ckpt), "--subnet", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o"), "--format", "torch"]) == 0
    assert "parameters" in capsys.readouterr().out
    assert not (tmp_path / "o" / "model.onnx").exists() and (tmp_path / "o" / "model.safetensors").exists()
    assert main(["export", "--supernet", str(ckpt), "--subnet", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o"), "--format", "tflite"]) == 2
    assert "--format: 'tflite'" in capsys.readouterr().err
    (tmp_path / "big.yaml").write_text(Subnet(256, 1, (1,), (128,), ("softmax",)).to_yaml())
    assert main(["export", "--supernet", str(ckpt), "--subnet", str(tmp_path / "big.yaml"), "--out", str(tmp_path / "o2")]) == 2
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
    return Transformer(TransformerConfig(256, 256, 32, "rope", 64, sub.layers), generator=torch.Generator().manual_seed(seed)).eval()


@pytest.mark.parametrize("types", [ALL_TYPES[0:4], ALL_TYPES[4:8], ALL_TYPES[8:12]], ids=["dense", "sparse", "linear"])
def test_torch_export_program_round_trip_every_attention_type(types, tmp_path):
    from nas.export import program_parity
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

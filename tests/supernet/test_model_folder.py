"""Model folders like the field's: a README.md model card (Hugging Face front matter, then prose, values from the card,
escaped), a config.json of the architecture, no host name or path of the machine in any file an export writes, and a
causal LM whose layers all keep one key/value cache shape generating through optimum's ORTModelForCausalLM token for
token as `nas generate`."""

import json
import os
import platform
from pathlib import Path

import pytest
import torch
import yaml

from nas.cli import main
from search_spaces import Subnet, UserError
from supernet import SuperTransformer
from supernet.artifact import read_card
from supernet.checkpoint import save_checkpoint
from supernet.model_folder import Facts, Metric, md, optimum_ready, render_readme, stack_config

from tests.nas.test_export import fake_predictor

SOFTMAX = Subnet(64, 2, (2, 2), (128, 256), ("softmax", "gqa:2"))  # one key/value cache shape: 2 heads of 32 = 64 wide


def front_matter(text: str) -> tuple[dict, str]:
    assert text.startswith("---\n")
    head, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(head), body


HOST = "nas-test-host-53.example"


def host_device(root: Path):
    """A fake device (tests.latency.latency_fakes.FakeDevice's timings, nothing timed) whose fingerprint carries this host's real
    facts, the host name among them, and a command line naming ``root``: what a card must not keep."""
    from latency.timing_core import host_facts
    from tests.latency.latency_fakes import FakeDevice

    class Host(FakeDevice):
        def fingerprint(self):
            return {**host_facts(), "device": "fake", "runtime": "fake", "threads": 1, "command": f"nas export {root}"}

    return Host()


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    """`nas export` of SOFTMAX with every record a card can hold: held-out data, a predictor and a measured latency
    (the fake device), every file written (torch.export program, model.onnx, the cached decoder)."""
    import latency.device

    root = tmp_path_factory.mktemp("folder")
    supernet = SuperTransformer(tiny, generator=torch.Generator().manual_seed(0)).eval()
    ckpt = save_checkpoint(root / "ck.pt", supernet, {}, step=3)
    (root / "s.yaml").write_text(SOFTMAX.to_yaml())
    (root / "val.txt").write_bytes(bytes(range(256)) * 8)
    pred = fake_predictor(tiny, root / "pred")
    patch = pytest.MonkeyPatch()
    patch.setattr(latency.device, "get_device", lambda name, **kw: host_device(root))
    patch.setattr(platform, "node", lambda: HOST)  # the host name every fingerprint takes: one no file holds by chance
    try:
        assert main(["export", str(ckpt), "--subnet", str(root / "s.yaml"), "--out", str(root / "model"), "--val-data",
                     str(root / "val.txt"), "--val-windows", "2", "--seq-len", "32", "--predictor", str(pred),
                     "--timing-target", "fake", "--repeats", "2", "--rounds", "1", "--timing-warmup", "1", "-q"]) == 0
    finally:
        patch.undo()
    return root / "model"


def test_no_file_of_an_export_names_the_host_or_a_path_of_this_machine(exported):
    host = HOST
    roots = {str(exported.parent), os.path.realpath(exported.parent)}
    names = sorted(p.name for p in exported.iterdir())
    assert {"README.md", "config.json", "generation_config.json", "model_card.json", "model.onnx", "step.onnx",
            "model.pt2", "model.safetensors", "subnet.yaml"} <= set(names)  # fmt: skip
    for path in exported.iterdir():
        data = path.read_bytes()
        assert host.encode() not in data, f"{path.name} names the host {host}"
        for r in roots:
            assert r.encode() not in data, f"{path.name} names {r}"
        assert str(Path.cwd()).encode() not in data or path.suffix in (".onnx", ".pt2", ".safetensors"), path.name
    card = read_card(exported)
    # what reproduces it instead: names and digests
    assert card["source"]["supernet"]["name"] == "ck.pt" and len(card["source"]["supernet"]["sha256"]) == 64
    assert card["latency"]["predictor"]["name"] == "pred" and len(card["latency"]["predictor"]["sha256"]) == 64
    assert card["validation"]["source"] == "--val-data val.txt"
    assert "hostname" not in card["measured"]["device"] and "command" not in card["measured"]["device"]
    assert card["measured"]["device"]["cpu_model"]  # what makes the timing comparable stays


def test_the_readme_is_a_hugging_face_model_card_of_the_cards_numbers(exported):
    card = read_card(exported)
    meta, body = front_matter((exported / "README.md").read_text())
    assert meta["license"] == "unknown" and meta["library_name"] == "nas-transformers"
    assert meta["pipeline_tag"] == "text-generation" and {"nas-transformers", "onnx", "safetensors"} <= set(meta["tags"])
    assert meta["metrics"] == ["bits_per_byte"]
    result = meta["model-index"][0]["results"][0]
    assert result["task"]["type"] == "text-generation"
    assert result["metrics"][0] == {"type": "bits_per_byte", "value": card["validation"]["bits_per_byte"],
                                    "name": "validation bits/byte (bits/byte)"}
    assert f"| validation bits/byte | {card['validation']['bits_per_byte']:.4f} | bits/byte | validation |" in body
    m, p = card["measured"], card["latency"]
    assert f"Measured: **{m['median_ms']:.3f} ms**" in body and f"on `fake` ({m['device']['cpu_model']}" in body
    assert f"Predicted: {p['predicted_ms']:.3f} ms by the `additive` latency predictor `pred`" in body
    assert "| 1 | `gqa:2` | 2 | 2 / 2 | 256 |" in body
    assert 'file_name="step.onnx"' in body and "ORTModelForCausalLM" in body  # optimum runs this one
    assert f"`model.safetensors` `{card['files']['model.safetensors']}`" in body
    config = json.loads((exported / "config.json").read_text())
    assert {k: config[k] for k in ("model_type", "task", "vocab_size", "hidden_size", "num_hidden_layers", "head_dim",
                                   "max_position_embeddings", "use_cache")} == {
        "model_type": "nas_transformer", "task": "causal-lm", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
        "head_dim": 32, "max_position_embeddings": 256, "use_cache": True}  # fmt: skip
    assert config["num_attention_heads_per_layer"] == [2, 2] and config["intermediate_size_per_layer"] == [128, 256]
    assert config["attention_types"] == ["softmax", "gqa:2"] and config["num_attention_heads"] == 2
    assert json.loads((exported / "generation_config.json").read_text())["max_length"] == 256
    onnx = card["onnx"]
    assert onnx["inputs"] == ["input_ids"] and onnx["outputs"] == ["logits"]
    assert card["decode_step"]["form"] == "cached decoder" and card["decode_step"]["inputs"][1] == "past_key_values.0.key"


def test_card_values_are_escaped_in_the_readme(tiny):
    """What comes from the card cannot add markup, a heading, a table row or front matter to the README."""
    evil = "<script>alert(1)</script> | x\n# Heading\n---\nlicense: mit"
    card = {"space": tiny.to_dict(), "subnet": SOFTMAX.to_dict(), "parameters": 1, "files": {}, "license": "unknown"}
    facts = Facts("text-generation", stack_config(tiny, SOFTMAX, "causal-lm"), metrics=(Metric("m", "m", 1.0, evil),),
                  datasets=(evil,), data=evil, training=evil, notes=(evil,), subnet="d64 `L2`")  # fmt: skip
    meta, body = front_matter(render_readme(card, facts))
    assert meta["datasets"] == [evil] and meta["license"] == "unknown"  # YAML keeps it as data
    assert "<script>" not in body and "&lt;script&gt;" in body
    assert not any(line.startswith(("# Heading", "---", "license:")) for line in body.splitlines())
    assert "\\| x" in body and md("a_b*c") == "a\\_b\\*c" and md(1.5) == "1.5"
    assert "`d64 'L2'`" in body  # a code span: shown as it is, its backticks cannot end it


def test_optimum_readiness_says_why_not(tiny):
    assert optimum_ready(stack_config(tiny, SOFTMAX, "causal-lm", use_cache=True)) is None
    wide = Subnet(128, 1, (2,), (128,), ("softmax",))  # 2 heads of 32: not 128 / 2
    assert "hidden_size / num_attention_heads = 64, this model's is 32" in optimum_ready(
        stack_config(tiny, wide, "causal-lm", use_cache=True))
    mixed = Subnet(64, 2, (2, 4), (128, 128), ("softmax", "gqa:2"))
    assert "different head counts" in optimum_ready(stack_config(tiny, mixed, "causal-lm", use_cache=True))
    assert "do not all keep a key/value cache" in optimum_ready(stack_config(tiny, SOFTMAX, "causal-lm", use_cache=False))


def test_a_folder_of_an_older_export_still_loads_and_its_graphs_are_refused_in_one_line(exported, tmp_path):
    """A folder exported before these files and names: the model loads (safetensors and the card; README and config
    are descriptions, not read); a graph with the old input names is refused by every reader, saying to export again."""
    import shutil

    from supernet import load_model
    from supernet.onnx_export import check_inputs
    from tasks.translation.onnx import OnnxTranslation

    old = tmp_path / "old"
    shutil.copytree(exported, old)
    for name in ("README.md", "config.json", "generation_config.json"):
        (old / name).unlink()
    assert load_model(old).num_params() == read_card(exported)["parameters"]

    class Graph:  # an encoder.onnx of 0.2.0: input "source", outputs cross.*
        def get_inputs(self):
            from types import SimpleNamespace

            return [SimpleNamespace(name="source")]

    with pytest.raises(UserError, match=r"^old: exported by an older nas-transformers \(inputs source; this version reads "
                                        r"input_ids, past_key_values\.\*\): export the model again with `nas export`$"):
        OnnxTranslation(Graph(), Graph(), "old")
    check_inputs(["input_ids", "position", "past.0.k"], "new")  # a window's state keeps its past.{i}.{name}


def test_optimum_generates_as_nas_generate(tiny, tmp_path, capsys):
    """A causal LM whose layers all keep one key/value cache shape, exported as `nas export` writes it, loads in optimum's
    ORTModelForCausalLM (its cached decoder, past_key_values / present) and generates, greedily, token for token what
    `nas generate --temperature 0` prints."""
    pytest.importorskip("optimum.onnxruntime", reason="optimum-onnx is not installed (the dev extra: pip install optimum-onnx)")
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import PretrainedConfig

    from supernet import Transformer, TransformerConfig
    from tasks.stack.export import write_model

    model = Transformer(TransformerConfig.from_subnet(tiny, SOFTMAX), generator=torch.Generator().manual_seed(2)).eval()
    g = torch.Generator().manual_seed(102)
    with torch.no_grad():
        for name, p in model.named_parameters():  # large weights: peaked, varied predictions (an untrained model's
            if "ln" not in name:  # greedy bytes repeat one byte)
                p.normal_(0.0, 0.2, generator=g)
    out = tmp_path / "model"
    write_model(model, tiny, out, formats=("onnx",))
    prompt, n = "def main(", 40
    assert main(["generate", "--model", str(out), "--prompt", prompt, "--max-new-tokens", str(n), "--temperature", "0"]) == 0
    printed = capsys.readouterr().out

    ort_model = ORTModelForCausalLM.from_pretrained(out, config=PretrainedConfig.from_pretrained(out), file_name="step.onnx")
    assert ort_model.can_use_cache  # the cached decoder: past_key_values in, present out
    ids = torch.tensor([list(prompt.encode())])
    generated = ort_model.generate(ids, max_new_tokens=n, do_sample=False)[0, ids.shape[1]:].tolist()
    from supernet import load_model
    from supernet.generate import generate

    reference = list(generate(load_model(out), prompt.encode(), n, temperature=0))
    assert len(set(reference)) > 5, "the model's greedy bytes vary (else the comparison shows little)"
    assert generated == reference
    assert printed == prompt + bytes(reference).decode("utf-8", errors="replace") + "\n"  # what the command printed


def test_an_image_classifiers_folder(tmp_path):
    """An image classifier's folder: README (image-classification, the accuracy), config.json with the ViT's keys and
    the class names, model.onnx taking pixel_values (parity-checked)."""
    import numpy as np
    import onnxruntime as ort

    from search_spaces import parse_space
    from tasks.image_classification.export import save_vision_model, write_onnx
    from tasks.image_classification.model import ViT

    from tests.tasks.image_classification.test_vision import SPACE

    space = parse_space(SPACE, where="vision.yaml")
    model = ViT(space, space.largest(), generator=torch.Generator().manual_seed(0)).eval()
    out = tmp_path / "vit"
    card = {"data": {"source": "PNG class folders in shirts", "classes": ["shirt", "<b>boot</b>", "bag"], "hash": "ab" * 8},
            "validation": {"accuracy": 0.5, "images": 60}, "test": {"accuracy": 0.25, "images": 60}}  # fmt: skip
    save_vision_model(model, out, card)
    record = write_onnx(model, out, None)
    assert record["inputs"] == {"pixel_values": "(batch, C, H, W) float32 in [0, 1]"} and record["parity_max_abs"] <= 1e-4
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["pixel_values"] and [o.name for o in session.get_outputs()] == ["logits"]
    assert session.run(None, {"pixel_values": np.zeros((2, 1, 8, 8), np.float32)})[0].shape == (2, 3)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "nas_transformer_vit" and config["image_size"] == 8 and config["num_labels"] == 3
    assert config["id2label"] == {"0": "shirt", "1": "<b>boot</b>", "2": "bag"} and config["patch_size"] == 2
    meta, body = front_matter((out / "README.md").read_text())
    assert meta["pipeline_tag"] == "image-classification" and "onnx" in meta["tags"]
    assert [m["metrics"][0]["value"] for m in meta["model-index"][0]["results"]] == [0.5, 0.25]
    assert "| test top-1 accuracy | 0.2500 | fraction correct | test |" in body and "`pixel_values`" in body
    assert not (out / "generation_config.json").exists()


def test_a_sequence_classifiers_folder(tmp_path):
    """A sequence classifier (one stack, bidirectional): text-classification, the accuracy beside bits per label, the
    ids' meaning; no cached decoder (an encoder)."""
    from search_spaces import load_space
    from supernet import Transformer, TransformerConfig
    from tasks.stack.export import write_model

    space = load_space("lra-tiny")
    subnet = space.smallest()
    model = Transformer(TransformerConfig.from_subnet(space, subnet), generator=torch.Generator().manual_seed(0)).eval()
    validation = {"bits_per_byte": 1.25, "metric": "bits/label", "accuracy": 0.625, "examples": 48,
                  "tokens": "ids 0..C-1 the classes, C [CLS] (first), C+1 padding, C+2+i symbol i"}  # fmt: skip
    write_model(model, space, tmp_path / "m", formats=("onnx",), card={"validation": validation})
    files = {p.name for p in (tmp_path / "m").iterdir()}
    assert {"README.md", "config.json", "model.onnx"} <= files and "step.onnx" not in files
    meta, body = front_matter((tmp_path / "m" / "README.md").read_text())
    assert meta["pipeline_tag"] == "text-classification" and meta["metrics"] == ["bits_per_label", "accuracy"]
    assert "| validation accuracy | 0.6250 | fraction correct | validation |" in body
    assert "Input ids: ids 0..C-1 the classes, C \\[CLS\\] (first)" in body
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["task"] == "sequence-classification" and config["is_decoder"] is False and config["use_cache"] is False

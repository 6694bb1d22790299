"""Every ONNX file an export writes describes itself: its ``nas.*`` metadata, read back through ONNX Runtime, equals
its card (causal LM ``model.onnx`` and ``step.onnx``, masked LM ``model.onnx``, translation's ``encoder.onnx`` and
``decoder_step.onnx``), the graphs' own keys kept and the card's checksums taken after; and ``nas translate`` refuses
a text longer than the model reads in one line, before translating anything."""

import json
import shutil

import pytest
import torch

import nas
from nas.cli import main
from tasks.stack.export import export_subnet
from search_spaces import Subnet, parse_space
from supernet import SuperTransformer, load_model
from supernet.artifact import card_space, read_card
from supernet.files import sha256_file
from supernet.onnx_decode import read_layout
from supernet.onnx_export import add_metadata, onnx_session, read_metadata
from tasks.translation.artifact import save_translation_model
from tasks.translation.export import write_translation_onnx
from tasks.translation.model import TranslationSuperTransformer
from tasks.translation.onnx import read_layout as translation_layout
from tasks.translation.space import TranslationSubnet

from tests.tasks.translation.translation_fakes import MINI_SEQ2SEQ
from tests.tasks.masked_lm.test_masked_lm import ENCODER

CAUSAL = ENCODER.replace("name: micro-encoder", "name: micro-decoder").replace("task: masked-lm", "task: causal-lm")
SUBNET = Subnet(16, 1, (1,), (32,), ("softmax",))  # the smallest graphs: the exporter's time is the file's
S2S_SUBNET = {
    "encoder": {"embed_dim": 16, "depth": 1, "heads": [1], "ffn_dim": [16], "attention": ["softmax"]},
    "decoder": {"embed_dim": 16, "depth": 1, "heads": [1], "ffn_dim": [16], "attention": ["softmax"], "cross_heads": [1],
                "cross_layers": [1]},
}  # fmt: skip
S2S_SPACE = MINI_SEQ2SEQ.format(positions="rope").replace("depth: [3]", "depth: [1]").replace("cross_layers: [1, 2, 3]",
                                                                                           "cross_layers: [1]")
SPECIALS = {"causal-lm": {}, "masked-lm": {"MASK": 255}, "seq2seq": {"PAD": 256, "BOS": 257, "EOS": 258}}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """{graph name: (export folder, graph path)} of the three tasks' exports, each at its smallest."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root, graphs = tmp_path_factory.mktemp("onnx-meta"), {}
    for text, name in ((CAUSAL, "causal"), (ENCODER, "masked")):
        space = parse_space(text, where=f"{name}.yaml")
        supernet = SuperTransformer(space, generator=torch.Generator().manual_seed(0)).eval()
        result = export_subnet(supernet, SUBNET, root / name, formats=("onnx",))
        graphs[f"{name}/model.onnx"] = (result.out, result.onnx_path)
    graphs["causal/step.onnx"] = (root / "causal", root / "causal" / "step.onnx")  # the cached decoder: softmax only
    s2s = parse_space(S2S_SPACE, where="mini-s2s.yaml")
    static = TranslationSuperTransformer(s2s, generator=torch.Generator().manual_seed(0)).extract(
        TranslationSubnet.from_dict(S2S_SUBNET)).eval()  # fmt: skip
    out = root / "seq2seq"
    save_translation_model(static, out, {"corpus": {"data": None, "data_seed": 0, "lang": None, "corpus_hash": None}})
    record = write_translation_onnx(static, out, None)
    for key in ("encoder", "decoder_step"):
        graphs[f"seq2seq/{record[key]}"] = (out, out / record[key])
    yield graphs
    torch.set_num_threads(threads)


GRAPHS = ["causal/model.onnx", "causal/step.onnx", "masked/model.onnx", "seq2seq/encoder.onnx", "seq2seq/decoder_step.onnx"]


@pytest.mark.parametrize("graph", GRAPHS)
def test_the_metadata_read_through_onnxruntime_equals_the_card(exports, graph):
    folder, path = exports[graph]
    card = read_card(folder)
    meta = onnx_session(path, threads=1).get_modelmeta().custom_metadata_map
    ours = {k: v for k, v in meta.items() if k.startswith("nas.")}
    assert json.loads(ours["nas.specials"]) == SPECIALS[card["space"]["task"]]
    assert ours == {
        "nas.task": card["space"]["task"],
        "nas.vocab_size": str(card["space"]["vocab_size"]),
        "nas.max_seq_len": str(card["space"]["max_seq_len"]),
        "nas.tokenizer": "bytes",
        "nas.specials": json.dumps(SPECIALS[card["space"]["task"]], sort_keys=True),
        "nas.subnet": json.dumps(card["subnet"], sort_keys=True, separators=(",", ":")),
        "nas.space_hash": card_space(folder).hash,
        "nas.version": nas.__version__,
    }
    # the checksum in the card is the described file's (the metadata came first), and nothing in it hashes the card
    assert card["files"][path.name] == sha256_file(path)
    assert not any("card" in k for k in meta)
    # the graphs' own keys are kept: the layouts the decoding loops build their inputs from
    session = onnx_session(path, threads=1)
    if graph == "causal/step.onnx":
        assert read_layout(session)["input_ids"]["limit"] is None  # rope: positions do not end at max_seq_len
    elif graph.startswith("seq2seq/"):
        layout = translation_layout(session)
        assert ("position" in layout) == graph.endswith("decoder_step.onnx") and "input_ids" in layout
    else:
        assert set(meta) == set(ours)


def test_a_quantized_copy_keeps_the_metadata(exports, tmp_path):
    from latency.quantize import quantize_model

    _, path = exports["causal/model.onnx"]
    quantize_model(path, tmp_path / "model.int8-dynamic.onnx", "int8-dynamic", max_error=None)
    ours = {k: v for k, v in read_metadata(path).items() if k.startswith("nas.")}
    theirs = read_metadata(tmp_path / "model.int8-dynamic.onnx")  # (+ the quantizer's own onnx.infer)
    assert len(ours) == 8 and {k: v for k, v in theirs.items() if k.startswith("nas.")} == ours


def test_the_task_specials_are_the_tasks_own_ids():
    from tasks.masked_lm.masking import MASK_BYTE
    from tasks.translation.data import BOS, EOS, PAD

    assert SPECIALS["masked-lm"] == {"MASK": MASK_BYTE} and SPECIALS["seq2seq"] == {"PAD": PAD, "BOS": BOS, "EOS": EOS}


def test_an_export_with_metadata_still_loads_whole(exports):
    load_model(exports["causal/model.onnx"][0])  # check_parts: every part's sha256 as the card lists it
    load_model(exports["masked/model.onnx"][0])


def test_translate_refuses_an_over_long_text_in_one_line(exports, capsys):
    folder, _ = exports["seq2seq/encoder.onnx"]
    at_limit, over = "a" * 40, "ü" * 21  # 40 bytes; 42 bytes of UTF-8 in 21 characters
    for runtime in ("onnxruntime", "torch"):
        capsys.readouterr()
        assert main(["translate", "--model", str(folder), "open", over, "--engine", runtime, "--max-bytes", "2", "-q"]) == 2
        out, err = capsys.readouterr()
        assert out == ""  # refused before the first text was translated
        assert err == ("nas translate: error: text 2: 42 bytes (UTF-8); the model reads at most 40 (its max_seq_len): "
                       "shorten it or split it into sentences of at most 40 bytes\n")  # fmt: skip
    assert main(["translate", "--model", str(folder), at_limit, "--engine", "onnxruntime", "--max-bytes", "2", "-q"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_a_graph_whose_metadata_changed_after_its_card_is_refused(exports, tmp_path, capsys):
    folder, _ = exports["seq2seq/encoder.onnx"]
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    add_metadata(copy / "encoder.onnx", {"nas.max_seq_len": "1000"})
    capsys.readouterr()
    assert main(["translate", "--model", str(copy), "open", "--engine", "onnxruntime", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"nas translate: error: {copy / 'encoder.onnx'}: checksum ") and "does not match the model card" in err
    assert err.count("\n") == 1

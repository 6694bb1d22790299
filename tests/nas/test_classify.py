"""nas finetune --task classify and nas classify: an exported encoder learns a generated labelled set; padding does
not change a prediction; interrupted + resumed equals uninterrupted; each bad input is one line, exit 2, nothing written."""

import csv
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from nas.classify import (CARD, WEIGHTS, Classifier, load_classifier, read_labelled_csv, split_rows, text_bytes,
                          write_classifier)
from nas.cli import main
from tasks.stack.export import export_subnet
from search_spaces import Subnet, load_space
from supernet import SuperTransformer, load_model
from supernet.files import sha256_file
from supernet.model import Transformer, TransformerConfig

from tests.nas.test_finetune import interrupting_bar
from tests.supernet.test_train import one_thread  # noqa: F401  (autouse: micro models, one thread)

ENCODER = Subnet(64, 2, (2, 2), (128, 128), ("softmax", "linear"))
TOPICS = {
    "sport": "goal match team score player coach league ball win referee".split(),
    "food": "bread cheese soup onion garlic butter recipe oven salt pepper".split(),
    "tech": "kernel python compiler laptop network server cache thread query byte".split(),
}
FILLER = "the a of and to in is it on with".split()


def topic_rows(n: int, seed: int) -> list[tuple[str, str]]:
    """n (text, topic) rows, topics in turn: 5 to 13 words, each from the topic's list with probability 0.7, else filler."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        topic = list(TOPICS)[i % len(TOPICS)]
        words = [rng.choice(TOPICS[topic]) if rng.random() < 0.7 else rng.choice(FILLER) for _ in range(rng.integers(5, 14))]
        rows.append((" ".join(words), topic))
    return rows


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def setup(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("classify")
    encoder = SuperTransformer(load_space("encoder-tiny"), generator=torch.Generator().manual_seed(0)).eval()
    export_subnet(encoder, ENCODER, root / "encoder", formats=())
    causal = SuperTransformer(tiny, generator=torch.Generator().manual_seed(0)).eval()
    export_subnet(causal, Subnet(64, 1, (2,), (128,), ("softmax",)), root / "causal", formats=())
    write_csv(root / "topics.csv", ["body", "topic"], topic_rows(180, seed=0))
    return root


def finetune(root, out, *extra, data="topics.csv"):
    return main(["finetune", "--task", "classify", "--model", str(root / "encoder"), "--data", str(root / data), "--out",
                 str(out), "--text-column", "body", "--label-column", "topic", *extra])


def test_classifier_learns_a_separable_set_and_nas_classify_reads_it(setup, capsys):
    root = setup
    out = root / "clf"
    assert finetune(root, out, "--max-steps", "100", "--eval-interval", "50") == 0
    printed = capsys.readouterr().out
    card = json.loads((out / CARD).read_text())
    before, after = card["validation"]["before"], card["validation"]["after"]
    k = len(TOPICS)
    # 180 rows, 20% held out, stratified: 36 validation rows, 12 per class
    assert card["validation"]["rows"] == 36 and card["data"]["train_rows"] == 144 and card["labels"] == sorted(TOPICS)
    assert before["accuracy"] < 1 / k + 0.15  # the untrained head: near chance (1/3)
    assert after["accuracy"] >= 0.9 and after["macro_f1"] >= 0.9  # chance is 1/3
    assert (f"accuracy {before['accuracy']:.4f} -> {after['accuracy']:.4f}, macro-F1 {before['macro_f1']:.4f} -> "
            f"{after['macro_f1']:.4f}") in printed
    assert card["task"] == "classify" and card["training"]["steps"] == 100 and card["seq_len"] == 256
    assert card["data"]["sha256"] == sha256_file(root / "topics.csv")
    assert card["source_model"]["dir"] == str((root / "encoder").resolve())
    assert card["source_model"]["subnet"] == ENCODER.to_dict()
    assert json.loads((out / "labels.json").read_text()) == sorted(TOPICS)

    # The folder reloads to the same accuracy on the same validation rows (recomputed here with scikit-learn).
    from sklearn.metrics import accuracy_score

    model, classes, _ = load_classifier(out)
    data = read_labelled_csv(root / "topics.csv", "body", "topic")
    _, val = split_rows(data, 0.2, 0)
    predicted = model.predict(text_bytes([data.texts[i] for i in val], 256))
    assert accuracy_score(data.targets()[val], predicted) == after["accuracy"]

    # nas classify: one label per line, in order; from arguments and from a CSV
    texts = ["the referee and the coach of the team", "soup with onion and garlic", "a kernel thread on the server"]
    assert main(["classify", "--model", str(out), *texts]) == 0
    assert capsys.readouterr().out.split() == ["sport", "food", "tech"]
    write_csv(root / "val.csv", ["body", "topic"], [(data.texts[i], data.labels[i]) for i in val])
    assert main(["classify", "--model", str(out), "--data", str(root / "val.csv"), "--text-column", "body",
                 "--label-column", "topic"]) == 0
    got = capsys.readouterr()
    assert got.out.split() == [classes[i] for i in predicted]
    assert f"accuracy {after['accuracy']:.4f}" in got.err


def test_padding_does_not_change_a_prediction():
    """A short text gets the same logits alone and batched with longer texts (no pad byte reaches the encoder),
    for the attention types of encoder-tiny; a padded batch through the encoder itself would change them."""
    space = load_space("encoder-tiny")
    subnet = Subnet(64, 4, (2, 2, 1, 2), (128, 128, 128, 128), ("local:32", "cosformer:256", "performer:64", "gqa:2"))
    torch.manual_seed(0)
    model = Classifier(Transformer(TransformerConfig.from_subnet(space, subnet), generator=torch.Generator().manual_seed(1)),
                       3, generator=torch.Generator().manual_seed(2)).eval()
    with torch.no_grad():
        model.head.weight.normal_(0, 1, generator=torch.Generator().manual_seed(3))  # a head whose logits differ visibly
    short = b"a short text"
    others = [b"a much longer text about many things " * 3, b"x" * 200, b"another one, of middling length"]
    with torch.no_grad():
        alone = model.logits([short])[0]
        batched = model.logits([others[0], short, *others[1:]])
        assert torch.allclose(batched[1], alone, atol=1e-5, rtol=0)
        for i, text in enumerate(others):
            assert torch.allclose(batched[[0, 2, 3][i]], model.logits([text])[0], atol=1e-5, rtol=0)
        # what this avoids: padding the short text with zero bytes to the batch's length moves its logits
        padded = torch.tensor([list(short) + [0] * (200 - len(short))])  # (1, 200)
        assert (model(padded)[0] - alone).abs().max() > 1e-3
    assert model.predict([short, *others]).tolist() == [int(alone.argmax()), *(int(model.logits([t])[0].argmax())
                                                                               for t in others)]


def test_interrupted_and_resumed_equals_uninterrupted(setup, capsys, monkeypatch):
    import nas.commands.finetune as ft

    root = setup
    steps = ["--max-steps", "8", "--ckpt-interval", "3", "--eval-interval", "4", "--batch-size", "8"]
    assert finetune(root, root / "straight", *steps) == 0
    real_bar = ft._progress_bar
    monkeypatch.setattr(ft, "_progress_bar", interrupting_bar(real_bar, 5))  # Ctrl-C after step 5
    capsys.readouterr()
    assert finetune(root, root / "resumed", *steps) == 130
    assert "interrupted at step 5" in capsys.readouterr().out
    assert sorted(p.name for p in (root / "resumed").iterdir()) == ["train"]  # no classifier yet
    monkeypatch.setattr(ft, "_progress_bar", real_bar)
    assert finetune(root, root / "resumed", *steps) == 2  # refuses to start over
    assert "already holds a training run (train/latest.pt); add --resume" in capsys.readouterr().err
    assert finetune(root, root / "resumed", *steps, "--lr", "0.01", "--resume") == 2
    assert capsys.readouterr().err == "nas finetune: error: --lr: a resumed run keeps its value (0.001); got 0.01\n"
    assert finetune(root, root / "resumed", *steps, "--resume") == 0
    a, b = load_file(str(root / "straight" / WEIGHTS)), load_file(str(root / "resumed" / WEIGHTS))
    assert a.keys() == b.keys() and any(k.startswith("head.") for k in a)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    ca, cb = (json.loads((root / d / CARD).read_text())["validation"] for d in ("straight", "resumed"))
    assert ca == cb
    # a data file that changed under a run is refused on resume
    (root / "copy.csv").write_bytes((root / "topics.csv").read_bytes())
    monkeypatch.setattr(ft, "_progress_bar", interrupting_bar(real_bar, 1))
    assert finetune(root, root / "changed", *steps, data="copy.csv") == 130
    with open(root / "copy.csv", "a") as f:
        f.write("one more goal,sport\n")
    capsys.readouterr()
    assert finetune(root, root / "changed", *steps, "--resume", data="copy.csv") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"nas finetune: error: {root / 'copy.csv'}: changed since the run started (sha256 ")
    assert err.endswith("a resumed run trains on the same rows\n")
    # the fine-tuned encoder differs from the source model (the whole encoder is trained, not only the head)
    source = load_model(root / "encoder").state_dict()
    assert not torch.equal(a["encoder.tok_emb.weight"], source["tok_emb.weight"])


VALID = "text,label\nw,a\nx,a\ny,b\nz,b\n"  # a valid CSV: the flag cases fail on the flag
NOT_UTF8 = "text,label\ncaf\xe9,a\nb,b\n".encode("latin-1")


@pytest.mark.parametrize(
    "content, extra, message",
    [
        ("body,label\nx,a\ny,b\n", [], "{csv}: no column 'text' (--text-column); columns found: 'body', 'label'"),
        ("text\nx\ny\n", [], "{csv}: no column 'label' (--label-column); columns found: 'text'"),
        ("text,label\nx,a\ny,a\nz,a\n", [], "{csv}: column 'label' holds one class ('a' in 3 rows); classification needs "
         "at least 2 classes"),
        ("", [], "{csv}: empty; expected a CSV with a header row naming the columns ('text', 'label') and one row per text"),
        ("text,label\n", [], "{csv}: no rows under the header; expected labelled texts in columns 'text' and 'label'"),
        (NOT_UTF8, [], "{csv}: not UTF-8 (byte 0xe9 at offset 14); --data expects a UTF-8 CSV file"),
        ("text,label\nx,a\ny,a\nz,b\n", [], "{csv}: column 'label': class 'b' (1 row); each class needs at least 2 rows "
         "(one for training, one for validation)"),
        ("text,label\nx,a\n,b\nz,b\n", [], "{csv}: line 3: empty text in column 'text'"),
        (VALID, ["--task", "sentiment"], "--task: 'sentiment' is not one of classify (leave --task out "
         "to fine-tune the language model)"),
        (VALID, ["--model", "{root}/causal"], "{root}/causal/model_card.json: a causal-lm model (space "
         "'tiny': causal attention); --task classify needs an encoder (a model of a task: masked-lm or "
         "sequence-classification space)"),
        (VALID, ["--tokens", "1M"], "--tokens: not used by --task classify (it fine-tunes on --data's "
         "labelled rows, no teacher, writes safetensors)"),
        (VALID, ["--seq-len", "512"], "--seq-len: 512 exceeds the model's max_seq_len 256"),
        ("text,label\n" + "".join(f"t{i},{'ab'[i % 2]}\n" for i in range(6)), ["--val-fraction", "0.1"],
         "--val-fraction: 0.1 of {csv}'s 6 rows leaves 1 for validation and 5 for training; each needs at least one row "
         "per class (2 classes)"),
    ],
    ids=["no-text-column", "no-label-column", "one-class", "empty", "header-only", "not-utf8", "class-of-one-row",
         "empty-text", "unknown-task", "causal-model", "lm-flag", "seq-len", "val-too-small"],
)
def test_bad_input_is_one_line_and_writes_nothing(setup, tmp_path, capsys, content, extra, message):
    root = setup
    path = tmp_path / "data.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "out"
    extra = [e.format(root=root) for e in extra]
    args = ["finetune", "--task", "classify", "--model", str(root / "encoder"), "--data", str(path), "--out", str(out),
            "--max-steps", "2", *extra]
    if "--task" in extra:
        del args[1:3]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == f"nas finetune: error: {message.format(csv=path, root=root)}\n"
    assert not out.exists()


def test_refusals_outside_the_csv(setup, tmp_path, capsys):
    root = setup
    out = tmp_path / "out"
    assert main(["finetune", "--task", "classify", "--model", str(root / "encoder"), "--out", str(out)]) == 2
    assert capsys.readouterr().err == ("nas finetune: error: --data: --task classify needs a labelled CSV (--data FILE.csv "
                                       "with a text and a label column)\n")
    assert main(["finetune", "--model", str(root / "encoder"), "--out", str(out), "--text-column", "body"]) == 2
    assert capsys.readouterr().err == "nas finetune: error: --text-column: only with --task classify\n"
    assert not out.exists()
    assert main(["classify", "--model", str(root / "encoder"), "some text"]) == 2
    assert capsys.readouterr().err == (f"nas classify: error: {root / 'encoder' / CARD}: missing; {root / 'encoder'} is not "
                                       "a classifier written by `nas finetune --task classify`\n")
    assert main(["classify", "--model", str(root / "encoder")]) == 2
    assert "give the texts to classify as arguments or --data FILE.csv" in capsys.readouterr().err
    # a classifier folder whose label list was edited after writing is refused (the card holds its checksum)
    model = Classifier(load_model(root / "encoder"), 2, generator=torch.Generator().manual_seed(0))
    write_classifier(model, load_space("encoder-tiny"), ("neg", "pos"), tmp_path / "clf", {"seq_len": 256})
    assert main(["classify", "--model", str(tmp_path / "clf"), "fine"]) == 0
    assert capsys.readouterr().out.strip() in ("neg", "pos")
    (tmp_path / "clf" / "labels.json").write_text('["pos", "neg"]')
    assert main(["classify", "--model", str(tmp_path / "clf"), "fine"]) == 2
    assert capsys.readouterr().err.startswith(f"nas classify: error: {tmp_path / 'clf' / 'labels.json'}: checksum ")

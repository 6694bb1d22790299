"""The translation commands end to end on a toy corpus, and their bad input: one line, exit 2."""

import pytest

from nas.cli import main
from tasks.translation.data import languages

from tests.tasks.translation.translation_fakes import MINI_SEQ2SEQ, write_toy_tsv


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("s2s")
    space = root / "mini.yaml"
    space.write_text(MINI_SEQ2SEQ.format(positions="rope"))
    tsv = write_toy_tsv(root / "toy.tsv")
    out = root / "run"
    code = main(["train-supernet", str(space), "--data", str(tsv), "--out", str(out), "--max-steps", "3", "--batch-size", "8",
                 "--eval-batches", "1", "--lr-warmup", "1", "-q"])  # fmt: skip
    assert code == 0
    return root, out


def test_train_translate_and_score(trained, capsys):
    root, out = trained
    assert (out / "final.pt").exists() and (out / "log.jsonl").exists()
    capsys.readouterr()
    assert main(["translate", "--model", str(out), "file not found", "open", "--max-bytes", "6", "-q"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    (root / "sub.yaml").write_text(
        "encoder: {embed_dim: 16, depth: 3, heads: [1, 1, 1], ffn_dim: [16, 16, 16], attention: [softmax, linear, softmax]}\n"
        "decoder: {embed_dim: 24, depth: 1, heads: [2], ffn_dim: [32], attention: ['local:4'], cross_heads: [1], "
        "cross_layers: [2]}\n"
    )
    code = main(["translate", "--model", str(out), "--subnet", str(root / "sub.yaml"), "--eval", "test", "--limit", "3",
                 "--beam", "2", "--max-bytes", "6", "-q"])  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert text.startswith("test: 3 pairs (user; 0 skipped") and "beam 2" in text
    assert text.splitlines()[-1].startswith("chrF ") and " BLEU " in text


def test_export_then_translate_the_export_and_record_its_quality(trained, capsys):
    import json

    import torch

    from tasks.translation.artifact import load_translation_model
    from tasks.translation.train import load_translation_supernet

    root, out = trained
    (root / "sub2.yaml").write_text(
        "encoder: {embed_dim: 24, depth: 3, heads: [2, 1, 2], ffn_dim: [32, 16, 32], attention: [linear, softmax, 'local:4']}\n"
        "decoder: {embed_dim: 16, depth: 2, heads: [1, 2], ffn_dim: [16, 32], attention: [softmax, linear], "
        "cross_heads: [2, 1], cross_layers: [3, 1]}\n"
    )
    export = root / "export"
    assert main(["export", str(out / "final.pt"), "--subnet", str(root / "sub2.yaml"), "--out", str(export),
                 "-q"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "nats/target byte" in printed and "max |onnxruntime - torch|" in printed
    model, card = load_translation_model(export)
    # the two ONNX graphs, parity-checked on export, listed in the card with their checksums
    assert card["onnx"]["encoder"] == "encoder.onnx" and card["onnx"]["decoder_step"] == "decoder_step.onnx"
    assert {"encoder.onnx", "decoder_step.onnx"} <= set(card["files"]) and card["onnx"]["opset"] == 23
    assert card["onnx"]["parity_max_abs"]["encoder"] < 1e-5 and card["onnx"]["parity_max_abs"]["decoder_step"] < 1e-4
    supernet, _ = load_translation_supernet(out / "final.pt")
    src, tgt = torch.randint(0, 256, (2, 9)), torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        assert (model(src, tgt) - supernet(src, tgt, model.subnet)).abs().max().item() <= 1e-5
    assert card["task"] == "seq2seq" and card["corpus"]["corpus"] == "user" and card["validation"]["ce_per_target_byte"] > 0
    # the folder describes itself (README.md, config.json) and names no path of this machine: the corpus and the
    # supernet by name and digest
    assert card["corpus"]["data"] == "toy.tsv" and card["source"]["supernet"]["name"] == "final.pt"
    for path in export.iterdir():
        assert str(root).encode() not in path.read_bytes(), path.name
    config = json.loads((export / "config.json").read_text())
    assert config["model_type"] == "nas_transformer_seq2seq" and config["encoder_layers"] == 3
    assert config["decoder_attention_heads_per_layer"] == [1, 2] and config["cross_attention_encoder_layers"] == [3, 1]
    readme = (export / "README.md").read_text()
    assert "pipeline_tag: translation" in readme and "| decoder 1 | `linear` | 2 | 2 / 2 | 32 |" in readme
    assert f"| validation cross-entropy | {card['validation']['ce_per_target_byte']:.4f} | nats per target byte |" in readme
    # the ONNX graphs translate as torch does (greedy)
    capsys.readouterr()
    assert main(["translate", "--model", str(export), "file not found", "open", "--max-bytes", "8", "-q"]) == 0
    by_torch = capsys.readouterr().out
    assert main(["translate", "--model", str(export), "file not found", "open", "--max-bytes", "8", "--engine",
                 "onnxruntime", "-q"]) == 0  # fmt: skip
    assert capsys.readouterr().out == by_torch and len(by_torch.splitlines()) == 2
    # beam search and --eval through ONNX Runtime: the same translations and scores as torch's
    assert main(["translate", "--model", str(export), "file not found", "open", "--beam", "3", "--max-bytes", "8",
                 "-q"]) == 0  # fmt: skip
    by_torch = capsys.readouterr().out
    assert main(["translate", "--model", str(export), "file not found", "open", "--beam", "3", "--max-bytes", "8",
                 "--engine", "onnxruntime", "-q"]) == 0  # fmt: skip
    assert capsys.readouterr().out == by_torch
    assert main(["translate", "--model", str(export), "open", "--device", "cuda", "--engine", "onnxruntime"]) == 2
    assert capsys.readouterr().err == ("nas translate: error: --device: not with --engine onnxruntime (its sessions "
                                       "run on the CPU)\n")  # fmt: skip
    # the card names the corpus file, not where it lies: --eval finds it in the current folder, or --data says where
    assert main(["translate", "--model", str(export), "--eval", "val", "--limit", "2", "-q"]) == 2
    assert capsys.readouterr().err.startswith("nas translate: error: --eval: the corpus file toy.tsv (named in the card, "
                                              "hash ")  # fmt: skip
    tsv = ["--data", str(root / "toy.tsv")]
    assert main(["translate", "--model", str(export), "--eval", "val", "--limit", "2", "--beam", "2", "--max-bytes", "5",
                 *tsv, "-q"]) == 0  # fmt: skip
    quality = json.loads((export / "model_card.json").read_text())["quality"]["val"]
    readme = (export / "README.md").read_text()  # written again with the card: the new figures in it
    assert f"| chrF (torch, beam 2) | {quality['chrf']:.4f} | chrF | val |" in readme and "(onnxruntime, beam" not in readme
    assert quality["pairs"] == 2 and quality["beam"] == 2 and 0 <= quality["chrf"] <= 100
    assert main(["translate", "--model", str(export), "--eval", "val", "--limit", "2", "--beam", "2", "--max-bytes", "5",
                 "--engine", "onnxruntime", *tsv, "-q"]) == 0  # fmt: skip
    readme = (export / "README.md").read_text()
    assert "| chrF (onnxruntime, beam 2) |" in readme and "| BLEU (torch, beam 2) |" in readme
    printed = capsys.readouterr().out
    assert "beam 2, onnxruntime" in printed and printed.rstrip().endswith("(quality.val.onnxruntime)")
    card_quality = json.loads((export / "model_card.json").read_text())["quality"]
    assert card_quality["val"] == quality  # torch's figure kept
    by_ort = card_quality["val.onnxruntime"]
    assert by_ort["runtime"] == "onnxruntime" and {k: by_ort[k] for k in ("chrf", "bleu", "pairs")} == {
        k: quality[k] for k in ("chrf", "bleu", "pairs")}  # the same hypotheses, so the same scores
    capsys.readouterr()
    assert main(["export", str(out / "final.pt"), "--subnet", str(root / "sub2.yaml"), "--out",
                 str(root / "e2"), "--budget", "5ms", "--format", "torch", "-q"]) == 2  # fmt: skip
    assert capsys.readouterr().err == ("nas export: error: --budget: needs --timing-target DEVICE (the budget is checked "
                                       "against the measured latency)\n")  # fmt: skip
    assert not (root / "e2").exists()


def test_resume_of_a_translation_run_needs_no_space_argument(trained, capsys):
    _, out = trained
    capsys.readouterr()
    assert main(["train-supernet", "--out", str(out), "--resume", "--max-steps", "4", "--eval-batches", "1", "-q"]) == 0
    assert "trained 4 steps" in capsys.readouterr().out
    assert main(["train-supernet", "--out", str(out), "--resume", "--max-steps", "5", "--lang", "fr", "-q"]) == 2
    assert capsys.readouterr().err.strip() == "nas train-supernet: error: --lang fr differs from the run's None (a resumed run " \
                                              "keeps its corpus)"  # fmt: skip
    # the search's flags an encoder-decoder does not take yet are refused in one line
    assert main(["search", str(out / "final.pt"), "--predictor", str(out), "--out", str(out.parent / "s"), "--val-data",
                 str(out / "log.jsonl"), "-q"]) == 2  # fmt: skip
    assert capsys.readouterr().err == "nas search: error: --val-data: not for an encoder-decoder (task seq2seq) search yet\n"


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\nno tab\n")
    cases = [
        (["train-supernet", "translate-tiny", "--data", str(bad), "--out", str(tmp_path / "r1")],
         f"--data {bad}: line 2 has no tab (expected source<TAB>target)"),
        (["train-supernet", "translate-tiny", "--lang", "xx-none", "--out", str(tmp_path / "r2")],
         "--lang xx-none: no gettext catalogs in /usr/share/locale/xx-none/LC_MESSAGES (languages with catalogs on this "
         f"machine: {', '.join(languages()) or 'none'})"),
        (["train-supernet", "translate-tiny", "--seq-len", "64", "--out", str(tmp_path / "r3")],
         "--seq-len: not for a seq2seq space (a pair is bounded by the space's max_seq_len; the split is 80/10/10 by "
         "catalog or by line; compiling is for the LM run so far)"),
        (["train-supernet", "tiny", "--lang", "de", "--out", str(tmp_path / "r4")],
         "--lang: for a seq2seq (translation) space only; a language model reads --data"),
        (["measure-latency", "translate-tiny", "--device", "onnxruntime", "--precision", "int8-static", "--out",
          str(tmp_path / "t.csv")],
         "--precision int8-static: a seq2seq space (translate-tiny) is timed in fp32 only so far"),
        (["train-subnet", "--space", "translate-tiny", "--out", str(tmp_path / "r6")],
         "give the subnet (SUBNET.yaml) and --space SPACE, or --resume to continue the run in --out"),
        (["translate", "--model", str(tmp_path), "hello"],
         f"--model {tmp_path}: holds no checkpoint (final.pt or latest.pt of `nas train-supernet`) and no exported model "
         "(model_card.json of `nas export`)"),
    ]  # fmt: skip
    for argv, message in cases:
        capsys.readouterr()
        assert main(argv + ["-q"]) == 2, argv
        command = argv[0]
        assert capsys.readouterr().err == f"nas {command}: error: {message}\n"
    bad.write_text("a\tb\n\tb\n")
    assert main(["train-supernet", "translate-tiny", "--data", str(bad), "--out", str(tmp_path / "r5"), "-q"]) == 2
    assert capsys.readouterr().err.endswith("line 2 has an empty source (expected source<TAB>target, both non-empty)\n")
    space = tmp_path / "s.yaml"
    space.write_text(MINI_SEQ2SEQ.format(positions="rope").replace("translate: {source: 16, steps: 16, beam: 3}",
                                                                    "decode: {batch_size: 1, context: 16}"))  # fmt: skip
    assert main(["space", str(space)]) == 2
    assert capsys.readouterr().err == ("nas space: error: s.yaml: latency.decode: a seq2seq space is timed with translate "
                                       "workloads (source, steps, beam), not decode (a causal-lm workload)\n")  # fmt: skip


def test_a_ranker_calibrated_on_retrained_encoder_decoders(trained, capsys):
    """``nas fit-accuracy`` on a seq2seq supernet: each retrained model scored on the search's validation pairs with its
    own weights (the target) and the supernet's (a feature); ``--fitness calibrated`` then answers its prediction."""
    import json

    import numpy as np

    from nas.search import FitnessSettings, task_fitness
    from nas.search.calibrated import CalibratedFitness, features, load_ranker
    from search_spaces import UserError
    from tasks.translation.artifact import load_translation_model
    from tasks.translation.train import load_translation_supernet

    from tests.tasks.translation.translation_fakes import mini_space

    root, out = trained
    space = mini_space()
    uniform = space.uniform()
    picks = [max((s for s in uniform if s.encoder.attention[0] == a), key=lambda s: s.key) for a in space.attention]
    picks.append(space.smallest())
    folders = []
    for i, subnet in enumerate(picks):
        (root / f"r{i}.yaml").write_text(subnet.to_yaml())
        folder = root / f"retrained{i}"
        assert main(["train-subnet", str(root / f"r{i}.yaml"), "--space", str(root / "mini.yaml"), "--data",
                     str(root / "toy.tsv"), "--out", str(folder), "--tokens", str(600 + 300 * i), "--batch-size", "8",
                     "--threads", "1", "--seed", str(i), "-q"]) == 0  # fmt: skip
        folders.append(folder)
    capsys.readouterr()
    scoring = ["--val-windows", "2", "--eval-batch-size", "4"]
    ranker_dir = root / "ranker"
    assert main(["fit-accuracy", str(out / "final.pt"), *map(str, folders), *scoring, "--out", str(ranker_dir)]) == 0
    printed = capsys.readouterr().out
    assert "nats" in printed and "LOO MAE" in printed
    ranker = load_ranker(ranker_dir)
    assert ranker.report["n"] == 4 and {f"frac:{a}" for a in space.attention} <= set(features(space, picks[0], 1.0, 10))
    # the target is each model's own cross-entropy on the search's pairs, the feature the supernet's
    supernet, payload = load_translation_supernet(out / "final.pt")
    fitness, _ = task_fitness(supernet, payload, FitnessSettings(out / "final.pt", windows=2, batch_size=4))
    for folder, m in zip(folders, ranker.models):
        model, _ = load_translation_model(folder)
        assert m["retrained"] == pytest.approx(fitness.static(model), abs=1e-9)
        assert m["inherited"] == pytest.approx(float(fitness([model.subnet])[0]), abs=1e-9)
    # the table names each model's encoder-decoder
    assert (ranker_dir / "ranker.csv").read_text().count("| dec ") == 4 and (ranker_dir / "ranker.png").stat().st_size > 0
    assert json.loads((ranker_dir / "ranker.json").read_text())["fitness"]["task"] == "seq2seq"
    # the calibrated fitness answers the ranker's prediction over the inherited loss, and refuses other pairs
    identity = {**fitness.description, "data": fitness.data_digest}
    from nas.commands.common import file_digest

    digest = file_digest(out / "final.pt")
    calibrated = CalibratedFitness(fitness, ranker, supernet.space, supernet.num_params, identity, digest, str(ranker_dir))
    got = calibrated(picks[:2])
    want = ranker.predict(space, picks[:2], fitness(picks[:2]), [supernet.num_params(s) for s in picks[:2]])
    assert np.allclose(got, want) and not hasattr(calibrated, "heldout")
    other, _ = task_fitness(supernet, payload, FitnessSettings(out / "final.pt", windows=3, batch_size=4))
    with pytest.raises(UserError, match="fitted on other fitness windows \\(batches: 2 there, 3 here"):
        CalibratedFitness(other, ranker, supernet.space, supernet.num_params, {**other.description, "data": other.data_digest},
                          digest, str(ranker_dir))

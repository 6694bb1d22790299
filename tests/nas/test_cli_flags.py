"""The command line's promises (docs/cli.md): one meaning per flag name, old spellings that work and say what to use,
``--config`` / ``--print-config`` that round-trip, ``--json`` documents on stdout, a completion script."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from nas.cli import build_parser, main, parse
from nas.commands import vocabulary as V

from tests.conftest import ROOT
from tests.nas.search.test_search_fitness import run_dir, search_args, supernet  # noqa: F401 (fixtures)


def parsers() -> dict[str, argparse.ArgumentParser]:
    p = build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


# --------------------------------------------------------------------------- the vocabulary


def test_no_long_flag_means_two_things_across_the_commands():
    assert V.problems(parsers()) == []


def test_the_vocabulary_check_catches_a_second_meaning_and_an_undeclared_flag():
    ps = parsers()
    ps["measure-latency"].add_argument("--seq-len", dest="window", type=int)  # a declared name, another field
    ps["doctor"].add_argument("--device", dest="device")  # the right field, in a command the table does not list
    ps["predict"].add_argument("--frobnicate")  # a name the table does not know
    found = V.problems(ps)
    assert "measure-latency --seq-len: stores into 'window'; the vocabulary says 'seq_len'" in found
    assert ("doctor --device: not listed for doctor in the vocabulary (a new meaning needs a new name)") in found
    assert "predict --frobnicate: not in the vocabulary (nas/commands/vocabulary.py)" in found


def test_the_issue_s_collisions_have_one_name_each():
    ps = parsers()

    def flags(command):
        return {o for a in ps[command]._actions if not isinstance(a, V._Alias) for o in a.option_strings}

    # measure-latency times on its --device (the card's spelling; --timing-target is taken too, silently); search and
    # export, which also run models of their own, call the device they time on --timing-target
    assert {"--device", "--timing-threads", "--clock"} <= flags("measure-latency")
    assert "--timing-target" in {o for a in ps["measure-latency"]._actions for o in a.option_strings}
    for command in ("search", "export"):
        assert {"--timing-target", "--timing-threads", "--clock"} <= flags(command)
    assert "--device" not in flags("export")
    assert {"--runtime", "--engine"} & flags("translate") == {"--engine"}  # --runtime: the cuda timing runtime only
    assert "--warmup" not in set().union(*(flags(c) for c in ps))  # --lr-warmup / --timing-warmup
    assert "--lr-warmup" in flags("train-supernet") and "--timing-warmup" in flags("measure-latency")
    assert not {"--batch", "--eval-batch", "--max-tries", "--verify", "--measure"} & set().union(*(flags(c) for c in ps))
    # the supernet checkpoint: the first positional of every command that works on one
    for command in ("search", "fit-accuracy", "export"):
        first = next(a for a in ps[command]._actions if not a.option_strings)
        assert first.dest == "supernet", command


def test_docs_cli_shows_the_vocabulary_as_declared():
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert V.markdown() in page, "docs/cli.md: regenerate its tables from nas.commands.vocabulary.markdown()"


# --------------------------------------------------------------------------- old spellings

# The least each command needs to parse, and a value for each new flag an old spelling stands for.
MINIMAL = {
    "measure-latency": ["tiny", "--device", "cpu"], "export": ["ck.pt", "--subnet", "s.yaml", "--out", "o"],
    "search": ["ck.pt", "--predictor", "p"], "fit-accuracy": ["ck.pt", "m", "--out", "o"],
    "train-supernet": ["--out", "o"], "train-subnet": ["--out", "o"], "finetune": ["--model", "m", "--out", "o"],
    "space": ["tiny"], "translate": ["--model", "m"],
}
VALUES = {"--timing-target": "onnxruntime", "--engine": "onnxruntime", "--clock": "cpu", "SUPERNET": "other.pt"}


@pytest.mark.parametrize("command,old,new", [(c, o, n) for c, t in V.DEPRECATED.items() for o, n in t.items()])
def test_an_old_spelling_does_what_the_new_one_does_and_says_which_to_use(command, old, new, capsys):
    value = VALUES.get(new, "3")
    base = [command, *MINIMAL[command]]
    if new == "SUPERNET":  # export's checkpoint: was --supernet, now the positional
        base = [command, "--subnet", "s.yaml", "--out", "o"]
        want = parse([*base[:1], value, *base[1:]])[1]
    else:
        want = parse([*base, new, value])[1]
    assert capsys.readouterr().err == ""
    got = parse([*base, old, value])[1]
    assert vars(got) == vars(want)
    instead = f"use {new}" if new != "SUPERNET" else f"give the supernet checkpoint first, without {old}"
    assert capsys.readouterr().err == f"nas {command}: warning: {old} is an old spelling (kept for one release): {instead}\n"


def test_an_old_spelling_runs_the_command_with_one_warning(capsys):
    assert main(["space", "tiny", "--sample", "1", "--seed", "3"]) == 0
    out = capsys.readouterr()
    assert out.err.count("warning") == 1 and "--sample is an old spelling" in out.err and "use --samples" in out.err
    assert main(["space", "tiny", "--samples", "1", "--seed", "3"]) == 0
    again = capsys.readouterr()
    assert again.out == out.out and "warning" not in again.err


def test_the_demo_uses_no_old_spelling():
    import re

    text = (ROOT / "nas" / "demo.py").read_text()
    for command, table in V.DEPRECATED.items():
        for old in table:
            assert not re.search(rf'"{command}"[^\]]*"{old}"', text, re.S), (command, old)


# --------------------------------------------------------------------------- --config and --print-config


def printed(capsys, argv: list[str]) -> str:
    assert main([*argv, "--print-config"]) == 0
    out = capsys.readouterr()
    assert out.err == ""
    return out.out


def namespace(argv: list[str]) -> dict:
    got = vars(parse(argv)[1])
    return {k: v for k, v in got.items() if k not in ("config", "print_config", "run")}


ROUND_TRIPS = {
    "search": ["search", "runs/x/latest.pt", "--predictor", "a", "--predictor", "b", "--budget", "prefill:5ms,decode:1ms",
               "--population", "12", "--aging", "--timing-target", "onnxruntime", "--timing-threads", "1", "--clock", "cpu",
               "--mutate-prob", "0.25", "--hurdle-tokens", "500k"],
    "measure-latency": ["measure-latency", "tiny", "--device", "cpu", "--samples", "40", "--paired", "--combine",
                        "min", "--tolerance", "0.2", "--out", "t.csv"],
    "train-supernet": ["train-supernet", "tiny", "--out", "runs/t", "--max-time", "1h30m", "--lr", "1e-3", "--lr-warmup",
                       "50", "--split", "families", "--compile"],
    "export": ["export", "ck.pt", "--subnet", "s.yaml", "--out", "o", "--no-eval", "--timing-warmup", "4"],
    "fit-predictor": ["fit-predictor", "t.csv", "--out", "p", "--from", "a", "--from", "b", "--folds", "3"],
    "predict": ["predict", "a.yaml", "b.yaml", "--predictor", "p"],
}


@pytest.mark.parametrize("command", list(ROUND_TRIPS))
def test_print_config_round_trips(command, tmp_path, capsys):
    argv = ROUND_TRIPS[command]
    text = printed(capsys, argv)
    assert text.startswith(f"# nas {command} --config")
    (tmp_path / "run.yaml").write_text(text)
    from_file = [command, "--config", str(tmp_path / "run.yaml")]
    assert namespace(from_file) == namespace(argv)  # the same flags, positional arguments included
    assert printed(capsys, from_file) == text  # and the same file again


def test_flags_given_override_the_file_and_keys_take_dashes_or_underscores(tmp_path, capsys):
    (tmp_path / "run.yaml").write_text(
        "supernet: runs/x/latest.pt\npredictor: [a, b]\npopulation: 10\neval-batch-size: 8\nworker_batch: 2\n"
        "aging: true\nmax_redraws: 7\n")
    config = ["search", "--config", str(tmp_path / "run.yaml")]
    ns = namespace(config)
    assert (ns["supernet"], ns["predictor"], ns["population"], ns["eval_batch_size"], ns["worker_batch"]) == (
        "runs/x/latest.pt", ["a", "b"], 10, 8, 2)
    assert ns["aging"] is True and ns["max_redraws"] == 7 and ns["generations"] == 30  # the rest: the defaults
    ns = namespace([*config, "other.pt", "--population", "12", "--predictor", "c"])
    assert (ns["supernet"], ns["population"], ns["predictor"]) == ("other.pt", 12, ["c"])  # a repeatable flag: replaced
    (tmp_path / "lat.yaml").write_text("space: tiny\ntiming-target: cpu\nout: t.csv\n")
    ns = namespace(["measure-latency", "--config", str(tmp_path / "lat.yaml")])
    assert (ns["space"], ns["device"], ns["out"]) == ("tiny", "cpu", "t.csv")  # measure-latency's other name
    (tmp_path / "train.yaml").write_text("out: runs/t\nwarmup_steps: 9\nmax_time: 10m\n")  # a field's name, a duration
    ns = namespace(["train-supernet", "--config", str(tmp_path / "train.yaml")])
    assert ns["warmup_steps"] == 9 and ns["max_time"] == 600.0


def test_an_old_spelling_in_a_file_works_and_says_which_to_use(tmp_path, capsys):
    (tmp_path / "old.yaml").write_text("space: tiny\nthreads: 1\ndevice: cpu\nout: t.csv\n")
    ns = namespace(["measure-latency", "--config", str(tmp_path / "old.yaml")])
    assert (ns["timing_threads"], ns["device"]) == (1, "cpu")
    err = capsys.readouterr().err
    assert err == (f"nas measure-latency: warning: threads (in {tmp_path / 'old.yaml'}) is an old spelling (kept for one "
                   "release): use --timing-threads\n")


@pytest.mark.parametrize("text,message", [
    ("popuation: 3\n", "key 'popuation': nas search takes no such flag (did you mean population?)"),
    ("population: many\n", "key 'population': expected an integer, got 'many'"),
    ("population: 2.5\n", "key 'population': expected an integer, got 2.5"),
    ("margin: [1]\n", "key 'margin': expected a number, got [1]"),
    ("strategy: annealing\n", "key 'strategy': expected one of evolution, nsga2, random, got 'annealing'"),
    ("aging: 'yes'\n", "key 'aging': expected true or false, got 'yes'"),
    ("eval_batch_size: 3\neval-batch-size: 4\n",
     "keys 'eval_batch_size' and 'eval-batch-size' set the same flag; keep one"),
    ("- population\n", "expected a mapping of flag names to values, got a list"),
    ("population: [\n", "line 2, column 1: not valid YAML (expected the node content"),
    ("json: true\n", "key 'json': nas search takes no such flag"),
])
def test_a_bad_file_is_one_line_naming_the_file_and_key_exit_2(text, message, tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    assert main(["search", "ck.pt", "--predictor", "p", "--config", str(path), "--print-config"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith(f"nas search: error: {path}: {message}") and out.err.count("\n") == 1, out.err


def test_a_missing_config_file_is_named(tmp_path, capsys):
    assert main(["space", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert capsys.readouterr().err == f"nas space: error: --config: {tmp_path / 'nope.yaml'}: no such file\n"


def test_nas_search_runs_from_a_config_file_and_prints_json(run_dir, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv("NAS_NATIVE_KERNELS", "0")  # torch's attention paths: no wait on a kernel build (this is about flags)
    tmp, ckpt, _ = run_dir
    argv = search_args(tmp, ckpt, "--budget", "8ms", "--seed", "3", "--generations", "1", "--population", "4",
                       "--no-uniform-seeds")
    text = printed(capsys, argv)
    (tmp / "run.yaml").write_text(text)
    assert main(["search", "--config", str(tmp / "run.yaml"), "--json", "-q"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)  # stdout: one JSON document, nothing else
    assert doc == {"out": str(tmp / "out"), "exit_status": 0, **json.loads((tmp / "out" / "search.json").read_text())}
    assert doc["config"]["seed"] == 3 and doc["budgets"]["8ms"]["best"]["latency_ms"] <= 8
    assert "wrote " in out.err and "best_*.yaml" in out.err  # the table and paths the command prints: on stderr
    assert (tmp / "out" / doc["budgets"]["8ms"]["best"]["file"]).exists()


# --------------------------------------------------------------------------- --json


def test_json_documents_of_space_fit_predictor_predict_and_doctor(tiny, tmp_path, capsys):
    from latency.predictors import Predictor
    from latency.predictors.additive import Additive
    from latency.predictors.predictor import subnet_matrix

    from tests.latency.test_latency_predictors import sample, synthetic_ms

    def run_json(argv):
        status = main([*argv, "--json"])
        out = capsys.readouterr()
        return status, json.loads(out.out), out.err

    status, doc, err = run_json(["space", "tiny", "--samples", "2", "--seed", "1"])
    assert status == 0 and doc["space"] == "tiny" and doc["subnets"] == tiny.size() and len(doc["samples"]) == 2
    assert doc["largest"]["key"] == tiny.largest().key and "# sample 1" in err  # the printed YAML went to stderr
    rng = np.random.default_rng(7)
    a, b = rng.uniform(1, 10, 40), rng.uniform(1, 5, 40)
    (tmp_path / "plain.csv").write_text("a,b,ms\n" + "".join(f"{p},{q},{0.3 + 0.8 * p + 1.5 * q}\n" for p, q in zip(a, b)))
    status, doc, err = run_json(["fit-predictor", str(tmp_path / "plain.csv"), "--target", "ms", "--out",
                                 str(tmp_path / "pp"), "--models", "additive"])
    assert status == 0 and doc["chosen"] == "additive" and doc["metrics"]["held_out"]["mape"] < 1.0
    assert Path(doc["predictor"]).parent == tmp_path / "pp" and "chosen: additive" in err
    subnets = sample(tiny, 20, 8)
    x, _ = subnet_matrix("additive", tiny, tiny.workload(), subnets)
    p = Predictor("additive", Additive().fit(x, synthetic_ms(tiny, subnets)), tiny, tiny.workload(), {"device": "cpu"})
    p.save(tmp_path / "sp")
    (tmp_path / "s.yaml").write_text(tiny.largest().to_yaml())
    status, doc, _ = run_json(["predict", "--predictor", str(tmp_path / "sp"), str(tmp_path / "s.yaml")])
    assert status == 0 and doc["device"] == "cpu" and doc["predictions"][0]["file"] == str(tmp_path / "s.yaml")
    assert doc["predictions"][0]["predicted_ms"] == pytest.approx(float(p.predict([tiny.largest()])[0]))
    status, doc, err = run_json(["doctor", "--no-build"])
    assert status == 0 and doc["torch"] and "compiled attention kernels" in doc["kernels"] and "threads:" in err


def test_json_is_offered_where_a_command_prints_a_result():
    ps = parsers()
    have = {c for c, p in ps.items() if "--json" in p._option_string_actions}
    assert have == set(V.JSON)


# --------------------------------------------------------------------------- completion


def test_completion_script_completes_commands_flags_and_choices(tmp_path):
    from nas.commands.completion import script

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    (tmp_path / "nas.bash").write_text(script("bash"))

    def complete(*words: str) -> list[str]:
        line = " ".join(words)
        cmd = (f"source {tmp_path / 'nas.bash'}; COMP_WORDS=(nas {line}); COMP_CWORD={len(words)}; _nas; "
               'printf "%s\\n" "${COMPREPLY[@]}"')
        return subprocess.run([bash, "-c", cmd], capture_output=True, text=True, check=True).stdout.split()

    assert complete("sea") == ["search"]
    assert complete("search", "--timing-t") == ["--timing-target", "--timing-threads"]
    assert complete("search", "--verify") == ["--verify-top", "--verify-margin"]  # the old spelling --verify is not offered
    assert complete("search", "--strategy", "") == ["evolution", "nsga2", "random"]  # the registry's order
    assert complete("measure-latency", "tiny", "--config", "--print-c") == ["--print-config"]
    assert complete("translate", "--eng") == ["--engine"]
    zsh = script("zsh")
    assert zsh.splitlines()[1].startswith("autoload -U +X bashcompinit") and "complete -o filenames -F _nas nas" in zsh


def test_nas_completion_prints_the_script(capsys):
    assert main(["completion", "bash"]) == 0
    out = capsys.readouterr().out
    for command in parsers():
        assert f"        {command}) opts=" in out


def test_print_config_output_is_yaml_of_flag_names(capsys):
    text = printed(capsys, ["space", "tiny", "--samples", "2"])
    assert yaml.safe_load(text) == {"space": "tiny", "samples": 2, "seed": 0}

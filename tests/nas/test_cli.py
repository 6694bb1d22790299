import logging
import os
import re
import subprocess
import sys

import pytest
import torch

from nas.cli import command_modules, main
from search_spaces import UserError, load_space
from supernet import SuperTransformer

from tests.conftest import ROOT


def nas(*args):
    return subprocess.run([sys.executable, "-m", "nas", *args], capture_output=True, text=True, cwd=ROOT)


def test_help_lists_exactly_the_built_subcommands():
    out = nas("--help")
    assert out.returncode == 0
    names = list(command_modules())
    assert "translate" in names  # a task's own command (the translation task's) besides the generic ones
    for name in names:
        assert name in out.stdout
        sub = nas(name, "--help")
        assert sub.returncode == 0 and "example:" in sub.stdout and f"nas {name}" in sub.stdout
        assert "-v, --verbose" in sub.stdout and "-q, --quiet" in sub.stdout  # set up once in nas.cli, for every command


def test_space_prints_choices_size_and_param_counts(capsys):
    assert main(["space", "search_spaces/base.yaml"]) == 0
    out = capsys.readouterr().out
    base = load_space("base")
    model = SuperTransformer(base, generator=torch.Generator().manual_seed(0))
    assert f"{base.size():,}" in out
    assert f"{model.num_params(base.largest()):,} parameters" in out
    assert f"{model.num_params(base.smallest()):,} parameters" in out
    for choice in base.attention:
        assert choice in out


def test_space_sample_prints_loadable_subnets(capsys):
    from search_spaces import Subnet

    assert main(["space", "tiny", "--samples", "2", "--seed", "4"]) == 0
    out = capsys.readouterr().out
    docs = out.split("# sample ")[1:]
    assert len(docs) == 2
    subnet = Subnet.from_yaml(docs[0].split("\n", 1)[1])
    assert subnet in load_space("tiny")


def test_user_errors_are_one_line_exit_2():
    out = nas("space", "tiny", "--samples", "-1")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip() == "nas space: error: --samples: -1 is negative; give a count >= 0"


def test_notes_go_through_logging_to_stderr_and_quiet_keeps_warnings(capsys):
    from nas.cli import PACKAGES, log_level, logging_to_stderr

    log = logging.getLogger("nas.search.verify")
    with logging_to_stderr("search", log_level(verbose=0, quiet=0)):
        log.debug("detail")
        log.info("a note")
        log.warning("a warning")
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["nas search: a note", "nas search: warning: a warning"] and captured.out == ""
    with logging_to_stderr("search", log_level(verbose=0, quiet=1)):
        log.info("a note")
        log.warning("a warning")
    assert capsys.readouterr().err.splitlines() == ["nas search: warning: a warning"]
    with logging_to_stderr("search", log_level(verbose=1, quiet=0)):
        log.debug("detail")
    assert capsys.readouterr().err.splitlines() == ["nas search: detail"]
    # nas demo runs commands inside its own: the inner command's prefix while it runs, one line per note, then the outer's again
    with logging_to_stderr("demo"):
        with logging_to_stderr("export"):
            logging.getLogger("supernet.x").info("inner")
        logging.getLogger("latency.x").info("outer")
    assert capsys.readouterr().err.splitlines() == ["nas export: inner", "nas demo: outer"]
    assert not any(logging.getLogger(name).handlers for name in PACKAGES)  # nothing left behind



def test_a_script_with_its_own_root_handler_sees_each_note_once(capsys):
    """bench_claim runs commands in-process under ``logging.basicConfig``: the notes must not reach its root handler too."""
    from nas.cli import PACKAGES, logging_to_stderr

    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    root_handler = Collect()
    logging.getLogger().addHandler(root_handler)
    try:
        with logging_to_stderr("search"):
            logging.getLogger("nas.search").info("a note")
        logging.getLogger("nas.search").warning("after the command")  # the script's own set-up again
    finally:
        logging.getLogger().removeHandler(root_handler)
    assert capsys.readouterr().err.splitlines() == ["nas search: a note"]
    assert seen == ["after the command"]
    assert all(logging.getLogger(name).propagate for name in PACKAGES)


# --------------------------------------------------------------------------- progress in a log file


def test_progress_in_a_log_is_one_line_per_interval_and_the_last(monkeypatch):
    """Where stderr is not a terminal a bar becomes lines: the first update, then one per interval at most, then the
    last count at close; the count, percentage, postfix, rate and time left, never a redrawn frame."""
    from nas.commands.common import ProgressLines

    now, said = [100.0], []
    bar = ProgressLines(200, "training", "step", interval=30.0, clock=lambda: now[0], say=said.append)
    for step in range(1, 201):
        now[0] += 0.5  # 2 steps/s: 100 s in all
        bar.set_postfix_str(f"loss {4 - step / 100:.3f} nats/byte", refresh=False)
        bar.update(1)
    bar.close()
    bar.close()  # once only
    assert said == [
        "training: 1/200 step (0%), loss 3.990 nats/byte, 0m00s elapsed",
        "training: 61/200 step (30%), loss 3.390 nats/byte, 2.00 step/s, 0m30s elapsed, ETA 1m10s",
        "training: 121/200 step (60%), loss 2.790 nats/byte, 2.00 step/s, 1m00s elapsed, ETA 0m40s",
        "training: 181/200 step (90%), loss 2.190 nats/byte, 2.00 step/s, 1m30s elapsed, ETA 0m10s",
        "training: 200/200 step (100%), loss 2.000 nats/byte, 2.00 step/s, 1m40s elapsed, ETA 0m00s",
    ]
    said.clear()
    timed = ProgressLines(600, "training", "s", interval=30.0, clock=lambda: now[0], say=said.append)
    timed.n = 45.0
    timed.refresh()
    assert said == ["training: 45/600 s (8%), 0m00s elapsed, ETA 9m15s"]  # a bar over seconds: its time left, no rate
    idle = ProgressLines(3, "measuring on cpu", "visit", clock=lambda: now[0], say=said.append)
    idle.close()  # never moved (the command stopped before it): nothing to say
    assert len(said) == 1
    monkeypatch.setenv("NAS_PROGRESS_INTERVAL", "soon")
    from nas.commands.common import progress_interval

    with pytest.raises(UserError, match=r"^NAS_PROGRESS_INTERVAL='soon': not a number of seconds >= 0 "):
        progress_interval()


def test_the_training_loss_is_labelled_with_its_unit():
    from supernet.train import StepInfo, loss_unit

    assert [loss_unit(m) for m in ("bits/byte", "bits/masked byte", "nats/target byte", "bits/label", "top-1 error")] == [
        "nats/byte", "nats/masked byte", "nats/target byte", "nats/label", "nats"]
    # a BPE model's training positions are tokens (its held-out score stays per byte)
    assert [loss_unit(m, subword=True) for m in ("bits/byte", "nats/target byte", "bits/label")] == [
        "nats/token", "nats/target token", "nats/label"]
    from types import SimpleNamespace

    from supernet.train import reads_subwords

    assert [reads_subwords(SimpleNamespace(space=load_space(n)), None) for n in ("tiny", "tiny-bpe", "long-bpe")] == [
        False, True, True]
    assert reads_subwords(SimpleNamespace(), SimpleNamespace(space=load_space("translate-tiny-bpe")))
    from nas.commands.common import step_postfix

    info = StepInfo(7, 10, 1.0, None, 1e-3, {"largest": 2.5, "smallest": 3.25}, (), 3200.0, "nats/byte")
    assert step_postfix(info) == "step 7 loss(L/S) 2.500 3.250 nats/byte lr 1.00e-03 3.2k tok/s"


def test_no_progress_holds_for_the_commands_a_command_runs():
    """``nas demo --no-progress`` runs its stages through ``main``: they show none either, whatever their own flags."""
    from nas.cli import logging_to_stderr, progress_off, show_progress

    with logging_to_stderr("demo"):
        assert show_progress()
        with progress_off(True):
            with progress_off(False):  # a stage run by the demo, without the flag
                assert not show_progress()
            assert not show_progress()
        assert show_progress()


def _train_micro(tmp_path, *flags, env=None):
    """A 12-step train-supernet of the micro space with stderr in a file (not a terminal), as in a cluster job's log."""
    from tests.supernet.test_data import write_docs
    from tests.supernet.test_train import MICRO

    (tmp_path / "micro.yaml").write_text(MICRO)
    docs = write_docs(tmp_path / "docs", n=10)
    log = tmp_path / f"stderr{len(list(tmp_path.glob('stderr*')))}.log"
    out = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    with open(log, "wb") as err:
        done = subprocess.run(
            [sys.executable, "-m", "nas", "train-supernet", str(tmp_path / "micro.yaml"), "--out", str(out), "--data",
             str(docs), "--batch-size", "4", "--seq-len", "16", "--max-steps", "12", "--eval-interval", "6",
             "--eval-batches", "2", "--threads", "1", "--device", "cpu", *flags],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=err, timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "NAS_NATIVE_KERNELS": "0", **(env or {})})
    assert done.returncode == 0, log.read_text()[-3000:]
    return log.read_bytes()


PROGRESS_LINE = re.compile(r"^nas train-supernet: training: (\d+)/12 step \(\d+%\), loss\(L/S\) \d+\.\d{3} \d+\.\d{3} "
                           r"nats/byte lr \S+ [\d.]+k tok/s(, [\d.,]+ step/s)?, \d+m\d\ds elapsed(, ETA \d+m\d\ds)?$")


def test_a_long_command_logs_lines_to_a_file_not_bar_frames(tmp_path):
    every = _train_micro(tmp_path, env={"NAS_PROGRESS_INTERVAL": "0"})  # a line at every step
    assert b"\r" not in every and b"\x1b" not in every  # no bar frame, no terminal control
    lines = every.decode().splitlines()
    steps = [int(m.group(1)) for m in map(PROGRESS_LINE.match, lines) if m]
    assert steps == list(range(1, 13)), lines
    assert [ln for ln in lines if "training:" in ln and not PROGRESS_LINE.match(ln)] == []
    assert sum("validation bits/byte" in ln for ln in lines) == 2  # the notes stay, one line each
    default = _train_micro(tmp_path).decode().splitlines()  # every 30 s: the first step and the last
    assert [int(m.group(1)) for m in map(PROGRESS_LINE.match, default) if m] == [1, 12]
    assert len("\n".join(default)) < 2500
    quiet = _train_micro(tmp_path, "--no-progress").decode().splitlines()
    assert not [ln for ln in quiet if "training:" in ln or "encoding corpus" in ln]
    assert sum("validation bits/byte" in ln for ln in quiet) == 2

import logging
import subprocess
import sys

import torch

from nas.cli import command_modules, main
from search_spaces import load_space
from supernet import SuperTransformer

from .conftest import ROOT


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

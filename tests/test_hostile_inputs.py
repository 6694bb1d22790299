"""Round 4 of hostile and careless inputs (issue 55), each class where the input enters, on every surface of its kind:

* config files (``--config``): only through the bounded YAML reader; one file; flags written in full;
* writers of temporary files: unique names beside the target (a planted link is never followed), nothing left behind;
* ``nas data --out``: a folder of someone else's files is refused, two runs into one folder cannot both write;
* decoders: PNG headers, gzip streams and model cards are checked before anything is decoded or allocated;
* exported programs: a ``.pt2`` archive is checked entry by entry before ``torch.export.load`` sees it;
* URLs in messages: a password is never said;
* silent wrong results: 16-bit PNGs, a head wider than the data's classes, tabs in class names, spaces in file names;
* late refusals and misleading messages; a space that validates must train (every 2D type at every grid it can meet).

(The report page's own cases live in tests/test_report.py.)
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from nas.cli import main

from .conftest import ROOT


def one_error(capsys, argv: list[str]) -> str:
    """Run ``nas argv`` in this process: exit 2, nothing on stdout, exactly one line on stderr, returned."""
    assert main(argv) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.err, out.err[-2000:]
    return lines[0]


# --------------------------------------------------------------------------- (3) --config: the bounded reader, one file


def test_a_config_file_goes_through_the_bounded_yaml_reader(tmp_path, capsys):
    """Aliases, duplicate keys, deep nesting, files that are no files and huge values: one short line each, exit 2."""
    cases = {
        "alias.yaml": ("seed: &a 3\nsamples: *a\n", "alias.yaml: line 2, column 10: an alias (*a): aliases are not accepted"),
        "twice.yaml": ("samples: 1\nsamples: 3\n", "twice.yaml: duplicate key 'samples' at line 2 (first at line 1)"),
        "deep.yaml": ("samples: " + "[" * 5000 + "]" * 5000 + "\n", "deep.yaml: line 1, column 73: nested deeper than 64 levels"),
        "long.yaml": ("samples: [" + ", ".join(["1"] * 20000) + "]\n",
                      "long.yaml: key 'samples': expected an integer, got [1, 1, 1, 1, 1, 1, ...]"),
        "big.yaml": ("# " + "x" * 70_000 + "\nsamples: 1\n", "big.yaml: 70,014 bytes; a config file is at most 65,536 bytes"),
    }
    for name, (text, expected) in cases.items():
        (tmp_path / name).write_text(text)
        line = one_error(capsys, ["space", "tiny", "--config", str(tmp_path / name), "--print-config"])
        assert expected in line and len(line) < 300, (name, line[:400])
    (tmp_path / "folder.yaml").mkdir()
    line = one_error(capsys, ["space", "tiny", "--config", str(tmp_path / "folder.yaml"), "--print-config"])
    assert line == f"nas space: error: --config: {tmp_path / 'folder.yaml'}: a folder; expected a config file (a UTF-8 YAML file)"
    line = one_error(capsys, ["space", "tiny", "--config", "/dev/zero", "--print-config"])
    assert line == "nas space: error: --config: /dev/zero: not a regular file; expected a config file (a UTF-8 YAML file)"


def test_a_fifo_given_as_config_is_refused_unopened(tmp_path, capsys):
    """A FIFO is refused before it is opened (opening it would block until a writer came).  A writer is offered for
    5 s so that code which does open it reads ``samples: 7`` and exits 0 instead of hanging the suite."""
    fifo = tmp_path / "run.yaml"
    os.mkfifo(fifo)

    def writer():
        end = time.monotonic() + 5
        while time.monotonic() < end:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader yet
                time.sleep(0.05)
                continue
            os.write(fd, b"samples: 7\n")
            os.close(fd)
            return

    threading.Thread(target=writer, daemon=True).start()
    line = one_error(capsys, ["space", "tiny", "--config", str(fifo), "--print-config"])
    assert line == f"nas space: error: --config: {fifo}: not a regular file; expected a config file (a UTF-8 YAML file)"


def test_one_config_per_command_line_and_flags_written_in_full(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text("samples: 1\n")
    (tmp_path / "b.yaml").write_text("samples: 3\n")
    line = one_error(capsys, ["space", "tiny", "--config", str(tmp_path / "a.yaml"), f"--config={tmp_path / 'b.yaml'}",
                              "--print-config"])
    assert line.startswith("nas space: error: --config given 2 times (") and "give one file" in line, line
    # argparse's abbreviations are off: --conf is not --config (which it used to set without reading the file)
    line = one_error(capsys, ["space", "tiny", "--conf", str(tmp_path / "b.yaml"), "--print-config"])
    assert line == "nas space: error: --conf: nas space takes no such flag; flags are written in full: --config"
    line = one_error(capsys, ["space", "tiny", "--sam=2", "--print-config"])
    assert line == "nas space: error: --sam: nas space takes no such flag; flags are written in full: --samples"
    assert main(["space", "tiny", "--samples", "2", "--print-config"]) == 0  # the full name, as before
    assert "samples: 2" in capsys.readouterr().out


def test_every_parser_refuses_abbreviations():
    import argparse

    from nas.cli import _command_parser, build_parser
    from nas.commands.completion import flags_by_command

    parser = build_parser()
    assert parser.allow_abbrev is False
    for name in flags_by_command():
        assert _command_parser(parser, name).allow_abbrev is False, name
    src = (ROOT / "latency" / "devices" / "bundle_main.py").read_text()
    assert "allow_abbrev=False" in src  # the runner on the board: its own parser
    assert isinstance(parser, argparse.ArgumentParser)


# --------------------------------------------------------------------------- (7) URLs: a password is never said


PASSWORD_URL = "postgresql+nosuchdriver://alice:S3cretPW@127.0.0.1:5432/nas"


def test_hide_password_hides_every_form():
    from search_spaces.errors import hide_password

    assert hide_password("postgresql://alice:S3cretPW@127.0.0.1:5432/nas") == "postgresql://alice:***@127.0.0.1:5432/nas"
    assert hide_password("cannot open 'mysql://u:p@ss:w@h/db': x") == "cannot open 'mysql://u:***@h/db': x"
    assert hide_password("sqlite:////tmp/a.db ssh://pi@host:22 memory") == "sqlite:////tmp/a.db ssh://pi@host:22 memory"
    assert hide_password("auth failed (password S3cretPW)", "postgresql://alice:S3cretPW@h/db") == "auth failed (password ***)"


def test_storage_errors_never_say_the_password(tmp_path):
    from nas.search.storage import check_storage, open_storage
    from search_spaces import UserError

    for call in (check_storage, open_storage):
        with pytest.raises(UserError) as e:
            call(PASSWORD_URL)
        assert str(e.value).startswith("--storage: cannot open 'postgresql+nosuchdriver://alice:***@127.0.0.1:5432/nas': ")
        assert "S3cretPW" not in str(e.value)


def test_nas_search_refuses_a_storage_without_its_driver_first_naming_no_password(tmp_path, capsys):
    out = tmp_path / "out"
    line = one_error(capsys, ["search", str(tmp_path / "ck.pt"), "--predictor", str(tmp_path / "p"), "--budget", "5ms",
                              "--storage", PASSWORD_URL, "--out", str(out)])
    assert line.startswith("nas search: error: --storage: cannot open 'postgresql+nosuchdriver://alice:***@127.0.0.1:5432/"
                           "nas': Can't load plugin: sqlalchemy.dialects:postgresql.nosuchdriver"), line
    assert "S3cretPW" not in line and not out.exists()


def test_ssh_urls_with_a_password_are_refused_without_saying_it(capsys):
    from latency.devices.arm import parse_target
    from search_spaces import UserError

    with pytest.raises(UserError) as e:
        parse_target("ssh://alice:S3cretPW@board:22")
    assert "S3cretPW" not in str(e.value) and "alice:***" in str(e.value), str(e.value)


def test_the_log_and_error_lines_hide_passwords_whatever_wrote_them(capsys):
    from nas.cli import logging_to_stderr

    with logging_to_stderr("search"):
        logging.getLogger("nas.search").warning("retrying %s", "postgresql://alice:S3cretPW@db/nas")
    err = capsys.readouterr().err
    assert err == "nas search: warning: retrying postgresql://alice:***@db/nas\n"

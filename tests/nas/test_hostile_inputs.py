"""Round 4 of hostile and careless inputs (issue 55), each class where the input enters, on every surface of its kind:

* config files (``--config``): only through the bounded YAML reader; one file; flags written in full;
* writers of temporary files: unique names beside the target (a planted link is never followed), nothing left behind;
* ``nas data --out``: a folder of someone else's files is refused, two runs into one folder cannot both write;
* decoders: PNG headers, gzip streams and model cards are checked before anything is decoded or allocated;
* exported programs: a ``.pt2`` archive is checked entry by entry before ``torch.export.load`` sees it;
* URLs in messages: a password is never said;
* silent wrong results: 16-bit PNGs, a head wider than the data's classes, tabs in class names, spaces in file names;
* late refusals and misleading messages; a space that validates must train (every 2D type at every grid it can meet).

(The report page's own cases live in tests/nas/test_report.py.)
"""

from __future__ import annotations

import json
import logging
import re
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from nas.cli import main

from tests.conftest import ROOT


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


# --------------------------------------------------------------------------- (2, 5, 9, 10) nas data: temporary files,
# someone else's folder, two runs, late and misleading refusals


LISTOPS = ["data", "listops", "--n", "8", "--eval-n", "8", "--seed", "5", "-q"]


def test_write_tsv_never_follows_a_planted_link_and_leaves_nothing_when_interrupted(tmp_path):
    from tasks.sequence_classification.data import write_tsv

    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    for name in ("val.tsv.tmp", ".val.tsv.tmp", "val.tsv.tmp.tmp"):  # the old fixed name, and guesses at others
        (out / name).symlink_to(victim)
    digest, counts = write_tsv(out / "val.tsv", [(0, ["a", "b"]), (1, ["c"])])
    assert victim.read_text() == "keep me\n" and (out / "val.tsv").read_text() == "0\ta b\n1\tc\n"
    assert counts == {"0": 1, "1": 1}

    def rows():  # Ctrl-C (or a full disk) after two rows
        yield 0, ["a"]
        yield 1, ["b"]
        raise KeyboardInterrupt

    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(KeyboardInterrupt):
        write_tsv(out / "train.tsv", rows())
    assert sorted(p.name for p in out.iterdir()) == before  # no train.tsv, no temporary file left


def test_nas_data_refuses_a_folder_of_someone_elses_files(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "train.tsv").write_text("my own rows\n")
    line = one_error(capsys, [*LISTOPS, "--out", str(out)])
    assert line == (f"nas data: error: --out {out}: holds files nas data did not write (train.tsv) and no data.json; "
                    "choose a new or empty folder")
    assert (out / "train.tsv").read_text() == "my own rows\n" and sorted(p.name for p in out.iterdir()) == ["train.tsv"]
    (tmp_path / "empty").mkdir()
    assert main([*LISTOPS, "--out", str(tmp_path / "empty")]) == 0  # an empty folder is fine


def test_nas_data_rewrites_its_own_folder_without_following_planted_links(tmp_path, capsys):
    out = tmp_path / "lo"
    assert main([*LISTOPS, "--out", str(out)]) == 0
    (out / "val.tsv").write_text("0\t1\n")  # a changed file: generated again ...
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (out / "val.tsv.tmp").symlink_to(victim)  # ... past a link planted at the old fixed temporary name
    assert main([*LISTOPS, "--out", str(out)]) == 0
    assert victim.read_text() == "keep me\n" and "written" in capsys.readouterr().out
    record = json.loads((out / "data.json").read_text())
    from tasks.sequence_classification.data import file_sha256

    assert all(file_sha256(out / f"{s}.tsv") == record["sha256"][s] for s in ("train", "val", "test"))


def test_a_second_nas_data_run_into_a_folder_being_written_is_refused(tmp_path, capsys):
    from filelock import FileLock

    out = tmp_path / "lo"
    out.mkdir()
    with FileLock(out / ".nas-data.lock"):  # another run, writing
        line = one_error(capsys, [*LISTOPS, "--out", str(out)])
    assert line == (f"nas data: error: --out {out}: another `nas data` run is writing this folder now (.nas-data.lock is "
                    "held); wait for it to end, or choose another --out")
    assert sorted(p.name for p in out.iterdir()) == [".nas-data.lock"]
    assert main([*LISTOPS, "--out", str(out)]) == 0  # the lock released: it writes


def test_a_nas_data_run_killed_mid_write_is_written_again(tmp_path, capsys, monkeypatch):
    """kill -9 between two files: data.json is the unfinished claim; the folder is still ours, and a rerun writes it."""
    from tasks.sequence_classification import data

    out = tmp_path / "lo"
    calls = []
    real = data.write_tsv

    def dies(path, rows):
        if calls:
            raise SystemExit("killed")  # (what a kill leaves: the first file whole, the claim, the lock file)
        calls.append(path)
        return real(path, rows)

    with monkeypatch.context() as m:
        m.setattr(data, "write_tsv", dies)
        with pytest.raises(SystemExit):
            data.write_folder("listops", out, 8, 8, 5)
    assert sorted(p.name for p in out.iterdir()) == [".nas-data.lock", "data.json", "train.tsv"]
    line = one_error(capsys, ["train-supernet", "lra-tiny", "--data", str(out), "--out", str(tmp_path / "run")])
    assert line == (f"nas train-supernet: error: {out / 'data.json'}: written by a `nas data` run that did not finish; run "
                    "it again")
    assert not (tmp_path / "run").exists()
    assert main([*LISTOPS, "--out", str(out)]) == 0 and "written" in capsys.readouterr().out


@pytest.mark.parametrize("n, expected", [
    ("1000000000000", "--n: 1000000000000 examples is over the limit of 1,000,000 (LRA's largest split is 160,000)"),
    ("999999999999999999999", "--n: 999999999999999999999 examples is over the limit of 1,000,000"),
])
def test_nas_data_caps_n_before_anything_is_made(n, expected, tmp_path, capsys):
    line = one_error(capsys, ["data", "pathfinder", "--out", str(tmp_path / "p"), "--n", n])
    assert line.startswith(f"nas data: error: {expected}"), line
    line = one_error(capsys, ["data", "pathfinder", "--out", str(tmp_path / "p"), "--n", "10", "--eval-n", n])
    assert line.startswith("nas data: error: --eval-n: "), line
    assert not (tmp_path / "p").exists()


def corrupt_gzip(array: np.ndarray) -> bytes:
    """A gzip of an IDX file whose deflate stream is damaged in the middle (zlib.error when read)."""
    import gzip

    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    blob = bytearray(gzip.compress(header + array.astype(np.uint8).tobytes()))
    blob[30:60] = b"\xff" * 30
    return bytes(blob)


def test_a_corrupt_gzip_idx_is_one_line_and_leaves_no_out(tmp_path, capsys, monkeypatch):
    from tasks.sequence_classification import fmnist

    folder = tmp_path / "fm"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 40), ("t10k", 12)):
        (folder / f"{split}-images-idx3-ubyte.gz").write_bytes(corrupt_gzip(rng.integers(0, 256, size=(n, 28, 28))))
        (folder / f"{split}-labels-idx1-ubyte").write_bytes(bytes([0, 0, 8, 1]) + n.to_bytes(4, "big") + bytes(n))
    monkeypatch.setenv(fmnist.ENV, str(folder))
    out = tmp_path / "out"
    line = one_error(capsys, ["data", "fmnist-pixels", "--out", str(out), "--n", "20", "--eval-n", "8"])
    assert line.startswith(f"nas data: error: {folder / 'train-images-idx3-ubyte.gz'}: not a readable IDX file (gzip or "
                           "plain): "), line
    assert not out.exists()


def test_idx_readers_bound_what_a_gzip_may_expand_to(tmp_path, monkeypatch):
    """Both IDX readers (the image task's, nas data's Fashion-MNIST): a damaged stream and a gzip bomb are ValueErrors
    naming the file; the bomb is refused once the bound is passed, not decompressed whole."""
    import gzip

    from tasks.image_classification import data as images
    from tasks.sequence_classification import fmnist

    bad = tmp_path / "bad.gz"
    bad.write_bytes(corrupt_gzip(np.zeros((40, 28, 28))))
    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(bytes([0, 0, 8, 1]) + (1 << 22).to_bytes(4, "big") + bytes(1 << 22)))
    for module in (images, fmnist):
        with pytest.raises(ValueError, match=r"bad.gz: not a readable IDX file \(gzip or plain\): "):
            module.read_idx(bad)
        monkeypatch.setattr(module, "MAX_IDX_BYTES", 1 << 20)
        with pytest.raises(ValueError, match=r"bomb.gz: decompresses to more than 1,048,576 bytes; an IDX file here is at "
                                             r"most 1,048,576"):
            module.read_idx(bomb)


def planted(folder: Path, victim: Path, *names: str) -> None:
    """Links at ``names`` in ``folder`` to ``victim`` (what someone who can write there could leave)."""
    for name in names:
        (folder / name).symlink_to(victim)


def test_every_writer_makes_a_new_temporary_file_and_never_follows_a_planted_link(tmp_path):
    """The writers that used a fixed temporary name (``NAME.tmp``, ``.NAME.tmp``, ``NAME.<pid>.tmp``): each now makes a
    new file of a unique name; links planted at every old name point at a victim that stays as it was."""
    from latency import onnx_graphs, timing_core
    from supernet.files import atomic_stream, atomic_write

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    planted(out, victim, "t.json.tmp", ".t.json.tmp", "g.json.tmp", ".g.json.tmp", "a.txt.tmp", ".a.txt.tmp",
            "s.bin.tmp", ".s.bin.tmp")
    timing_core.write_json(str(out / "t.json"), {"a": 1})  # the timing sidecar (also on the board)
    onnx_graphs.write_json(out / "g.json", {"b": 2})  # the graph cache's layouts
    atomic_write(out / "a.txt", "text")
    with atomic_stream(out / "s.bin") as f:
        f.write(b"bytes")
    assert victim.read_text() == "keep me\n"
    assert json.loads((out / "t.json").read_text()) == {"a": 1} and json.loads((out / "g.json").read_text()) == {"b": 2}
    assert (out / "a.txt").read_text() == "text" and (out / "s.bin").read_bytes() == b"bytes"
    assert sorted(p.name for p in out.iterdir() if not p.is_symlink()) == ["a.txt", "g.json", "s.bin", "t.json"]


def test_a_failed_write_leaves_no_temporary_file_at_any_writer(tmp_path):
    from latency import timing_core
    from supernet.files import atomic_stream

    class Full(OSError):
        pass

    def fails(f):
        f.write(b"half")
        raise Full(28, "No space left on device")

    with pytest.raises(Full):
        timing_core.write_atomic(str(tmp_path / "t.npz"), fails)
    with pytest.raises(KeyboardInterrupt):
        with atomic_stream(tmp_path / "s.bin") as f:
            f.write(b"half")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_the_custom_op_compile_writes_into_a_new_folder(tmp_path, monkeypatch):
    """The ONNX Runtime custom-op library is compiled into a new folder beside it (it used ``NAME.<pid>.tmp``, where a
    planted link sent the compiler's output to the link's target); a failed compile leaves nothing."""
    from supernet.attention import ort_ops

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    compiler = tmp_path / "cc"
    compiler.write_text('#!/bin/sh\nwhile [ "$1" != "-o" ]; do shift; done\necho library > "$2"\n')
    compiler.chmod(0o755)
    out = tmp_path / "lib" / "ops.so"
    out.parent.mkdir()
    planted(out.parent, victim, f"ops.so.{os.getpid()}.tmp")
    assert ort_ops.compile_library(out, str(compiler), []) == out
    assert out.read_text() == "library\n" and victim.read_text() == "keep me\n"
    failing = tmp_path / "cc-fails"
    failing.write_text('#!/bin/sh\necho "error: no" >&2\nexit 1\n')
    failing.chmod(0o755)
    with pytest.raises(RuntimeError, match="cc-fails failed: error: no"):
        ort_ops.compile_library(tmp_path / "lib" / "other.so", str(failing), [])
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(["ops.so", f"ops.so.{os.getpid()}.tmp"])


def test_no_source_names_a_fixed_temporary_file():
    """Every ``.tmp`` literal left in the project is a suffix of a unique name (mkstemp's), or the check for one."""
    import re

    allowed = ("suffix=", "suffix: str =", "endswith(")
    found = []
    for folder in ("nas", "tasks", "supernet", "latency", "search_spaces", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for k, line in enumerate(path.read_text().splitlines(), 1):
                for m in re.finditer(r"""["'][^"'\n]*\.tmp["']""", line):
                    if not line[:m.start()].rstrip().endswith(allowed):
                        found.append(f"{path.relative_to(ROOT)}:{k}: {line.strip()}")
    assert not found, "\n".join(found)


# --------------------------------------------------------------------------- (6) an exported program is checked entry by
# entry before torch.export.load sees it


class Payload:
    """A pickle that makes a folder when it is unpickled: the proof that code ran (it touches nothing else)."""

    def __init__(self, target: Path):
        self.target = str(target)

    def __reduce__(self):
        return os.mkdir, (self.target,)


@pytest.fixture(scope="module")
def program_dir(tmp_path_factory, tiny):
    """A model folder with its torch.export program (the smallest subnet of tiny), as `nas export` writes one."""
    import torch

    from supernet import Transformer, TransformerConfig
    from supernet.artifact import export_program, save_model, update_card

    out = tmp_path_factory.mktemp("program") / "model"
    model = Transformer(TransformerConfig.from_subnet(tiny, tiny.smallest()), generator=torch.Generator().manual_seed(0))
    save_model(model.eval(), out, tiny)
    export_program(model, out / "model.pt2")
    update_card(out, files=["model.pt2"])
    return out


def tampered(src: Path, dst: Path, add: dict[str, bytes], config_edit=None) -> None:
    """A copy of the model folder ``src`` at ``dst`` whose program holds the entries ``add`` too (names under the
    archive's root), its constants config edited by ``config_edit``; the card's checksum updated to match."""
    import shutil
    import zipfile

    from supernet.artifact import update_card

    shutil.copytree(src, dst)
    with zipfile.ZipFile(src / "model.pt2") as z, zipfile.ZipFile(dst / "model.pt2", "w") as out:
        root = z.infolist()[0].filename.split("/", 1)[0]
        for item in z.infolist():
            data = z.read(item.filename)
            if config_edit and item.filename.endswith("_constants_config.json"):
                data = json.dumps(config_edit(json.loads(data))).encode()
            out.writestr(item, data)
        for name, data in add.items():
            out.writestr(zipfile.ZipInfo(f"{root}/{name}"), data)
    update_card(dst, files=["model.pt2"])


def test_a_program_with_legacy_pickled_weights_is_refused_and_nothing_runs(program_dir, tmp_path):
    import pickle

    from search_spaces import UserError
    from supernet.artifact import load_program

    proof = tmp_path / "ran"
    bad = tmp_path / "legacy"
    tampered(program_dir, bad, {"data/weights/model.pt": pickle.dumps(Payload(proof))})
    with pytest.raises(UserError) as e:
        load_program(bad)
    assert not proof.exists(), "the archive's pickle ran"
    import re

    assert re.fullmatch(re.escape(f"{bad / 'model.pt2'}: holds an entry a torch.export program does not have ('") +
                        r"[^/']+/data/weights/model\.pt'\); loading it could run code, refused", str(e.value)), str(e.value)
    assert load_program(program_dir) is not None  # the program as written loads


def test_a_program_with_an_opaque_object_is_refused_whatever_use_pickle_says(program_dir, tmp_path):
    import pickle

    from search_spaces import UserError
    from supernet.artifact import load_program

    proof = tmp_path / "ran"
    blob = pickle.dumps(Payload(proof))
    blob += b"\0" * (-len(blob) % 4)  # (a whole number of float32s, as a raw tensor's record would be)

    def add_opaque(config):
        meta = dict(next(iter(config["config"].values())))
        config["config"]["evil"] = {**meta, "path_name": "opaque_obj_0", "use_pickle": False}
        return config

    bad = tmp_path / "opaque"
    tampered(program_dir, bad, {"data/constants/opaque_obj_0": blob}, add_opaque)
    with pytest.raises(UserError) as e:
        load_program(bad)
    assert not proof.exists(), "the archive's pickle ran"
    assert re.search(r"holds an entry a torch.export program does not have \('.*/data/constants/opaque_obj_0'\); "
                     r"loading it could run code, refused$", str(e.value)), str(e.value)
    bad2 = tmp_path / "opaque-config"  # the config alone naming one (its file under a tensor's name): refused too
    tampered(program_dir, bad2, {},
             lambda c: {"config": {k: {**v, "path_name": "custom_obj_0"} for k, v in c["config"].items()}})
    with pytest.raises(UserError, match=r"model_constants_config.json: 'rope_cos' is stored as 'custom_obj_0', not as "
                                        r"raw tensor bytes; loading it could run code, refused"):
        load_program(bad2)


@pytest.mark.parametrize("name", ["data/aotinductor/model/model.so", "serialized_state_dict.pt", "extra/notes.txt",
                                  "data/weights/../weights/weight_0"])
def test_a_program_with_any_entry_a_safe_program_lacks_is_refused(program_dir, tmp_path, name):
    from search_spaces import UserError
    from supernet.artifact import load_program

    bad = tmp_path / "bad"
    tampered(program_dir, bad, {name: b"\0" * 8})
    with pytest.raises(UserError, match="holds an entry a torch.export program does not have"):
        load_program(bad)


# --------------------------------------------------------------------------- (4) what a model card claims is bounded by
# the weights file actually present, before a model is built


def test_a_card_claiming_a_huge_model_is_refused_before_allocation(program_dir, tmp_path, capsys):
    """A 7 KB card of vocabulary 2^20 and width 65536 (275 GB of weights) beside a small weights file: one line."""
    import shutil

    bad = tmp_path / "huge"
    shutil.copytree(program_dir, bad)
    card = json.loads((bad / "model_card.json").read_text())
    card["space"].update(vocab_size=1 << 20, embed_dim=[65536])
    card["subnet"]["embed_dim"] = 65536
    (bad / "model_card.json").write_text(json.dumps(card))
    line = one_error(capsys, ["generate", "--model", str(bad), "--max-new-tokens", "1"])
    assert line == (f"nas generate: error: {bad / 'model_card.json'}: describes a model of 68,745,167,072 parameters "
                    "that model.safetensors does not hold (tok_emb.weight: the card's (1048576, 65536), the file's "
                    "(256, 64)); the card and its weights do not match")  # (275 GB of float32, never allocated)


def test_fitting_model_builds_nothing_for_real_until_the_shapes_match(tmp_path):
    import torch
    from safetensors.torch import save_file

    from search_spaces import UserError
    from supernet.artifact import fitting_model

    save_file({"weight": torch.zeros(2, 3), "bias": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    built = []

    def build(n):
        def make():
            built.append(torch.empty(0).device.type)  # where the module is made: meta first, then for real
            return torch.nn.Linear(3, n)
        return make

    assert isinstance(fitting_model(tmp_path / "w.safetensors", build(2), tmp_path / "card.json"), torch.nn.Linear)
    assert built == ["meta", "cpu"]
    built.clear()
    with pytest.raises(UserError, match=r"card.json: describes a model of 4,000,000,000 parameters that w.safetensors does "
                                        r"not hold \(weight: the card's \(1000000000, 3\), the file's \(2, 3\)\)"):
        fitting_model(tmp_path / "w.safetensors", build(10**9), tmp_path / "card.json")
    assert built == ["meta"]


# --------------------------------------------------------------------------- (4, 8) images: headers before pixels, 16-bit
# grayscale scaled, the head as wide as the data's classes, class names escaped in tab-separated output


VISION = """
task: image-classification
image: {size: 8, channels: 1, classes: CLASSES}
resolution: [8]
patch: [2, 4]
stem: [linear]
stem_channels: 4
head_dim: 8
embed_dim: [16]
depth: [1]
layers: {heads: [1], ffn_dim: [16], attention: [softmax]}
latency: {image: {batch_size: 1}}
"""


def png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG that declares ``width`` x ``height`` 8-bit gray pixels and holds none (a few dozen bytes)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    return path


def write_png(path: Path, a: np.ndarray) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(a).save(path)
    return path


def png_folder(root: Path, classes: int, per_class: int = 4) -> Path:
    rng = np.random.default_rng(0)
    for k in range(classes):
        for i in range(per_class):
            write_png(root / f"c{k}" / f"{i}.png", rng.integers(0, 256, (8, 8)).astype(np.uint8))
    return root


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory):
    """An exported image classifier of 8 x 8 grayscale images, 3 classes named with a tab, a newline and a backslash."""
    import torch

    from search_spaces import parse_space
    from tasks.image_classification.export import save_vision_model
    from tasks.image_classification.model import ViT

    space = parse_space(VISION.replace("CLASSES", "3"))
    out = tmp_path_factory.mktemp("vision") / "model"
    model = ViT(space, space.smallest(), generator=torch.Generator().manual_seed(0))
    save_vision_model(model.eval(), out, {"data": {"classes": ["T-shirt\ttop", "two\nlines", "back\\slash"]}})
    return out


def test_png_sizes_are_read_from_the_header_before_any_pixel_is_decoded(tmp_path):
    from tasks.image_classification.data import read_png

    cases = {(20000, 20000): "Image size (400000000 pixels) exceeds limit of",  # Pillow's own bomb error
             (10000, 10000): "Image size (100000000 pixels) exceeds limit of",  # its warning, made a refusal
             (5000, 5000): "5,000 x 5,000 pixels; an image here is at most 16,777,216 pixels (4096 x 4096)"}
    for (w, h), expected in cases.items():
        path = png_header_only(tmp_path / f"{w}.png", w, h)
        with pytest.raises(ValueError) as e:
            read_png(path)
        assert str(e.value).startswith(f"{path}: ") and expected in str(e.value) and len(str(e.value)) < 250, str(e.value)


def test_a_16_bit_grayscale_png_is_scaled_to_8_bits_not_clipped(tmp_path):
    from tasks.image_classification.data import read_png

    values = np.array([[0, 1000, 32768, 65535]], dtype=np.uint16)
    a = read_png(write_png(tmp_path / "deep.png", values))
    assert a.dtype == np.uint8 and a.tolist() == [[[0, 4, 128, 255]]]  # round(v * 255 / 65535); clipping gave 0, 255 ...


def test_training_refuses_a_png_bomb_and_data_of_fewer_classes_than_the_head(tmp_path, capsys):
    space10 = tmp_path / "v10.yaml"
    space10.write_text(VISION.replace("CLASSES", "10"))
    space3 = tmp_path / "v3.yaml"
    space3.write_text(VISION.replace("CLASSES", "3"))
    data = png_folder(tmp_path / "three", 3, per_class=6)
    train = ["--max-steps", "1", "--batch-size", "2", "--eval-batches", "1", "--val-fraction", "0.34", "-q"]
    line = one_error(capsys, ["train-supernet", str(space10), "--data", str(data), "--out", str(tmp_path / "r10"), *train])
    assert line == ("nas train-supernet: error: the data has 3 classes; the space has 10 (image: classes): a model of 10 "
                    "outputs trained on 3 would predict classes the data does not have; set classes: 3 in the space")
    assert not (tmp_path / "r10").exists()
    png_header_only(data / "c1" / "bomb.png", 20000, 20000)
    line = one_error(capsys, ["train-supernet", str(space3), "--data", str(data), "--out", str(tmp_path / "r3"), *train])
    assert line.startswith(f"nas train-supernet: error: {data / 'c1' / 'bomb.png'}: Image size (400000000 pixels) exceeds")
    assert not (tmp_path / "r3").exists()


def test_classify_image_refuses_bombs_and_non_files_and_escapes_names(vision_model, tmp_path, capsys):
    bomb = png_header_only(tmp_path / "bomb.png", 20000, 20000)
    line = one_error(capsys, ["classify-image", str(vision_model), str(bomb)])
    assert line.startswith(f"nas classify-image: error: {bomb}: Image size (400000000 pixels) exceeds limit of "), line
    (tmp_path / "folder.png").mkdir()
    os.mkfifo(tmp_path / "fifo.png")
    for name, what in (("folder.png", "a folder"), ("fifo.png", "not a regular file (a FIFO, a socket or a device)"),
                       ("missing.png", "no such file")):
        line = one_error(capsys, ["classify-image", str(vision_model), str(tmp_path / name)])
        assert line == f"nas classify-image: error: {tmp_path / name}: {what}; expected a PNG file"
    odd = write_png(tmp_path / "a\tb.png", np.zeros((8, 8), np.uint8))
    deep = write_png(tmp_path / "deep.png", np.full((8, 8), 40000, np.uint16))  # 16 bits: read, scaled
    assert main(["classify-image", str(vision_model), str(odd), str(deep), "--top", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(len(line.split("\t")) == 7 for line in lines), lines
    assert lines[0].startswith(str(tmp_path / "a\\tb.png") + "\t")
    names = {f for line in lines for f in line.split("\t")[1::2]}
    assert names == {"T-shirt\\ttop", "two\\nlines", "back\\\\slash"}


def test_classify_image_refuses_a_card_of_fewer_classes_than_outputs(vision_model, tmp_path, capsys):
    """A model trained (before the check above) into a 3-wide head on data of 2 classes: one line, not an IndexError."""
    import shutil

    bad = tmp_path / "model"
    shutil.copytree(vision_model, bad)
    card = json.loads((bad / "model_card.json").read_text())
    card["data"]["classes"] = ["a", "b"]
    (bad / "model_card.json").write_text(json.dumps(card))
    image = write_png(tmp_path / "x.png", np.zeros((8, 8), np.uint8))
    line = one_error(capsys, ["classify-image", str(bad), str(image), "--top", "3"])
    assert line == ("nas classify-image: error: the model card names 2 classes, the model has 3 outputs: it was trained "
                    "into a wider head than its data's classes; train it again with the space's classes set to the data's")


def test_completion_keeps_a_file_name_with_spaces_whole(tmp_path):
    import shutil
    import subprocess

    from nas.commands.completion import script

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    (tmp_path / "nas.bash").write_text(script("bash"))
    for name in ("my file.png", "my other file.png", "x*y.png"):
        (tmp_path / name).write_bytes(b"")

    def complete(*words: str) -> list[str]:
        cmd = (f"source nas.bash; COMP_WORDS=(nas {' '.join(words)}); COMP_CWORD={len(words)}; _nas; "
               'printf "%s\\n" "${COMPREPLY[@]}"')
        done = subprocess.run([bash, "-c", cmd], capture_output=True, text=True, check=True, cwd=tmp_path)
        return done.stdout.splitlines()

    assert sorted(complete("classify-image", "m", "my")) == ["my file.png", "my other file.png"]
    assert complete("classify-image", "m", "x") == ["x*y.png"]  # not expanded as a pattern
    assert complete("classify-image", "--to") == ["--top"]  # flags as before


# --------------------------------------------------------------------------- (9) check first, create after


def test_log_tensorboard_without_the_package_is_refused_before_the_corpus_is_cached(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # (import tensorboard raises ImportError, as when absent)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text to train on. " * 400)
    out = tmp_path / "run"
    line = one_error(capsys, ["train-supernet", "tiny", "--data", str(corpus), "--out", str(out), "--log", "tensorboard",
                              "--max-steps", "1"])
    assert line == ("nas train-supernet: error: --log tensorboard: the tensorboard package is not installed (pip install "
                    "'nas-transformers[tensorboard]')")
    assert not out.exists()


# --------------------------------------------------------------------------- (10) messages that name the right thing


def install_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("install_script_55", ROOT / "scripts" / "install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_install_names_no_index_that_has_no_torch_as_the_source(monkeypatch, capsys):
    """An index that answers 404 for torch (a mistyped --torch-index) stops the plan in one line naming it, dry run or
    not, after the read-only listing alone: it is never printed as where torch comes from."""
    import subprocess

    install = install_script()
    asked = []

    def pip(cmd, **kw):  # the index answers 404, as a mistyped --torch-index does
        asked.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: 404 Client Error: Not Found for url: https://bad.example/cpu/torch/\n")

    monkeypatch.setattr(install.subprocess, "run", pip)
    monkeypatch.setattr(install, "installed_torch", lambda: None)
    monkeypatch.setattr(install, "pip_settings", lambda python: {})
    monkeypatch.setattr(install, "unreachable", lambda index, settings: None)  # the index answers: with a 404 for torch
    for dry in (["--dry-run"], []):
        asked.clear()
        with pytest.raises(SystemExit) as stop:
            install.main(["--torch", "cpu", "--torch-index", "https://bad.example/cpu", *dry])
        assert str(stop.value) == ("install.py: --torch-index https://bad.example/cpu: pip found no torch there (ERROR: 404 "
                                   "Client Error: Not Found for url: https://bad.example/cpu/torch/); give an index that "
                                   "has it, or --torch cuda / --torch none")
        assert len(asked) == 1 and asked[0][3:5] == ["index", "versions"]  # the listing only: nothing was installed
        assert "bad.example" not in capsys.readouterr().err  # not printed as the source before the refusal


def test_a_folder_or_fifo_given_as_a_file_is_named_as_such(tmp_path):
    from latency.table import read_plain
    from nas.search.fitness import validation_tokens
    from search_spaces import UserError
    from tasks.sequence_classification.data import vocabulary
    from tasks.translation.data import prepare_pairs

    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    kinds = {"folder": "a folder", "fifo": "not a regular file (a FIFO, a socket or a device)", "missing": "no such file",
             "dangling": "a link to a missing file"}
    for name, what in kinds.items():
        path = tmp_path / name
        with pytest.raises(UserError, match=rf"^{path}: {re.escape(what)}; expected a CSV file$"):
            read_plain(path, "ms")
        with pytest.raises(UserError, match=rf"^--val-data: {path}: {re.escape(what)}; expected a file of held-out text$"):
            validation_tokens("ck.pt", {}, path)
        with pytest.raises(UserError, match=rf"^--data {path}: {re.escape(what)} \(expected a source<TAB>target file\)$"):
            prepare_pairs(str(path), tmp_path / "cache")
        if name != "folder":  # (a folder is what nas data writes: its own refusals)
            with pytest.raises(ValueError, match=rf"^--data {path}: {re.escape(what)} \(expected a folder written by "):
                vocabulary(path, 2)


# --------------------------------------------------------------------------- (11) a space that validates trains: every 2D
# type at every grid the space can sample


DOCUMENTED_2D = ["swin:2", "swin:4", "swin:7", "swin-shift:2", "swin-shift:7", "axial", "convmod2d:3", "convmod2d:7",
                 "msla2d:3", "msla2d:7"]  # docs/attention-types.md's 2D types, at windows and kernels of several sizes


def grid_space(attention: str, resolutions=(28, 56), patches=(2, 4, 7, 14)) -> str:
    return (f"task: image-classification\nimage: {{size: 28, channels: 1, classes: 3}}\nresolution: {list(resolutions)}\n"
            f"patch: {list(patches)}\nhead_dim: 8\nembed_dim: [16]\ndepth: [1]\n"
            f"layers: {{heads: [1], ffn_dim: [16], attention: [softmax, \"{attention}\"]}}\n"
            "latency: {image: {batch_size: 1}}\n")


def runs_everywhere(space) -> list[str]:
    """Each of the space's 2D attention types (those that read the grid back from T: a 1D type runs on the flattened
    tokens whatever the grid) at each resolution and patch, through the supernet (what training samples): what
    failed, as 'type @ resolution/patch: error'."""
    import torch

    from search_spaces.attention import parse_attention, types
    from tasks.image_classification.model import SuperViT

    model = SuperViT(space, generator=torch.Generator().manual_seed(0)).eval()
    small = space.smallest()
    x = torch.rand(1, space.channels, space.image_size, space.image_size)
    failed = []
    grid_types = [a for a in space.attention if hasattr(types()[parse_attention(a).kind], "grid_problems")]
    assert grid_types, space.attention
    for a in grid_types:
        for r in space.resolutions:
            for p in space.patches:
                subnet = type(small)(small.embed_dim, small.depth, small.heads, small.ffn_dim, (a,) * small.depth, r, p,
                                     space.stems[0])
                try:
                    with torch.no_grad():
                        model(x, subnet)
                except (ValueError, RuntimeError) as e:
                    failed.append(f"{a} @ {r}/{p}: {str(e).splitlines()[0][:120]}")
    return failed


def test_swin_7_in_vision_tiny_is_refused_where_a_grid_it_samples_does_not_fit_it(tmp_path, capsys):
    text = (ROOT / "search_spaces" / "vision-tiny.yaml").read_text()
    old = 'attention: [softmax, linear, "local:8", xca, additive, axial, "convmod2d:3", "msla2d:3"]'
    assert old in text
    text = re.sub(r"\npatch: \[4\]", "\npatch: [4, 7]", re.sub(r"\nstem: \[[^]]*\]", "\nstem: [linear, conv]", text))
    (tmp_path / "swin.yaml").write_text(text.replace(old, 'attention: [softmax, linear, axial, "swin:7"]'))
    line = one_error(capsys, ["space", str(tmp_path / "swin.yaml")])
    assert line == ("nas space: error: swin.yaml: layers.attention[3]: swin:7: the window W=7 does not divide the grid side 4 "
                    "(resolution 28 at patch 7: every resolution and patch the space samples must fit)")


@pytest.mark.parametrize("attention", DOCUMENTED_2D)
def test_every_documented_2d_type_validates_only_where_it_runs_at_every_grid(attention):
    """Accepted by validation => runs at every resolution and patch through the supernet; refused => a grid it meets
    does not fit it (the refusal names the grid)."""
    from search_spaces import SpaceError, parse_space

    try:
        space = parse_space(grid_space(attention))
    except SpaceError as e:
        assert "does not divide the grid side" in str(e) or "exceeds the grid side" in str(e), str(e)
        kept = [p for p in (2, 4, 7, 14) if all(r // p % int(attention.split(":")[1]) == 0 for r in (28, 56))]
        if not kept:
            return
        space = parse_space(grid_space(attention, patches=kept))  # the patches whose grids fit: accepted
    assert runs_everywhere(space) == []


def test_every_shipped_image_space_runs_each_type_at_each_grid():
    import yaml

    from search_spaces import load_space, parse_space

    shipped = [p.stem for p in sorted((ROOT / "search_spaces").glob("*.yaml"))
               if (yaml.safe_load(p.read_text()) or {}).get("task") == "image-classification"]
    assert "vision-tiny" in shipped
    for name in shipped:
        assert runs_everywhere(load_space(name)) == [], name
    assert runs_everywhere(parse_space(grid_space("swin:7", patches=(4,)))) == []  # the window where its grid fits


def test_nas_classify_prints_each_label_on_one_line_whatever_it_holds(tmp_path, capsys):
    import torch

    from nas.classify import Classifier, write_classifier
    from search_spaces import load_space
    from supernet import Transformer, TransformerConfig

    space = load_space("encoder-tiny")
    encoder = Transformer(TransformerConfig.from_subnet(space, space.smallest()), generator=torch.Generator().manual_seed(0))
    model = Classifier(encoder.eval(), 2, generator=torch.Generator().manual_seed(0))
    write_classifier(model, space, ("two\nlines", "a\ttab"), tmp_path / "clf", {"seq_len": 256})
    assert main(["classify", "--model", str(tmp_path / "clf"), "one text", "another text", "a third"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and set(lines) <= {"two\\nlines", "a\\ttab"}, lines

"""Fault injection: bad inputs, full disks, kills and concurrent writers (README "Reliability").

* a table of bad inputs, each one clear line and exit 2, nothing written;
* disk full at the write sites: an ``OSError``-raising shim (everywhere) and a small tmpfs (where this
  process may mount one: root on Linux; skipped elsewhere, the shim tests still run);
* kill -9 at seeded random points of a measurement campaign, resumed to the uninterrupted table;
* a second writer of a timing table refused, a dead writer's lock released.
"""

from __future__ import annotations

import csv
import errno
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from latency.features import table_features
from latency.predictors import Predictor, load_predictor
from latency.predictors.additive import Additive
from latency.predictors.predictor import subnet_matrix
from latency.table import TimingTable, make_meta, read_timings
from nas.commands.checks import io_failure
from nas.cli import build_parser, main
from search_spaces import Subnet, UserError
from supernet import SuperTransformer, load_model
from supernet.checkpoint import save_checkpoint

from tests.conftest import ROOT
from tests.latency.latency_fakes import FakeDevice
from tests.latency.test_latency_table import SETTINGS
from tests.latency.test_latency_table import campaign as latency_table_campaign

SUBNET = Subnet(64, 1, (1,), (128,), ("softmax",))

SPACE = """\
name: t
task: causal-lm
vocab_size: 256
max_seq_len: 64
head_dim: 16
embed_dim: {embed}
depth: {depth}
layers:
  heads: [1, 2]
  ffn_dim: [64]
  attention: [softmax]
latency:
  prefill: {{batch_size: 1, seq_len: 32}}
"""


def space_file(tmp_path: Path, name: str, embed="[32, 64]", depth="[1, 2]", extra="") -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(SPACE.format(embed=embed, depth=depth) + extra)
    return str(path)


def one_error(capsys, argv: list[str]) -> str:
    """Run ``nas argv`` in this process: exit 2 and exactly one line on stderr, returned."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


# --------------------------------------------------------------------------- bad inputs


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny):
    """A supernet checkpoint, a subnet file and a predictor of tiny, plus broken variants."""
    d = tmp_path_factory.mktemp("inputs")
    ckpt = save_checkpoint(d / "ck.pt", SuperTransformer(tiny, generator=torch.Generator().manual_seed(0)), {}, step=1)
    (d / "s.yaml").write_text(SUBNET.to_yaml())
    (d / "empty.pt").write_bytes(b"")
    (d / "evil.pt").write_bytes(pickle.dumps(object()))
    rng = np.random.default_rng(0)
    subnets = [tiny.sample(rng) for _ in range(20)]
    x, _ = subnet_matrix("additive", tiny, tiny.workload(), subnets)
    Predictor("additive", Additive().fit(x, 1 + x.sum(1) * 1e-9), tiny, tiny.workload(), {"device": "cpu"}).save(d / "pred")
    return {"dir": d, "ckpt": str(ckpt), "subnet": str(d / "s.yaml"), "pred": str(d / "pred")}


def test_a_table_of_bad_inputs_each_one_line_exit_2(files, tmp_path, capsys):
    d, ckpt, subnet = files["dir"], files["ckpt"], files["subnet"]
    (tmp_path / "afile").write_text("x")
    afile = str(tmp_path / "afile")
    (tmp_path / "dup.yaml").write_text("embed_dim: 64\ndepth: 1\nheads: [1]\nffn_dim: [128]\nembed_dim: 96\n"
                                       "attention: [softmax]\n")
    (tmp_path / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    export = ["export", ckpt, "--subnet", subnet, "--no-eval", "--format", "torch"]
    cases = [
        (["space", space_file(tmp_path, "wide", embed="[64, 1000000000]")],
         "nas space: error: wide.yaml: embed_dim[1]: 1000000000 is above the limit of 65,536 for embed_dim"),
        (["space", space_file(tmp_path, "deep", depth="[1, 1000000000]")],
         "nas space: error: deep.yaml: depth[1]: 1000000000 is above the limit of 256 for depth"),
        (["space", space_file(tmp_path, "twice", extra="embed_dim: [16]\n")],
         "nas space: error: twice.yaml: duplicate key 'embed_dim' at line 14 (first at line 6): a key may appear once in a "
         "mapping"),
        (["space", str(tmp_path / "latin1.yaml")],
         f"nas space: error: {tmp_path / 'latin1.yaml'}: not UTF-8 text (byte 9: b'\\xe9'); a search space is UTF-8 YAML"),
        (export[:3] + [str(tmp_path / "dup.yaml"), "--out", str(tmp_path / "e")],
         "nas export: error: dup.yaml: duplicate key 'embed_dim' at line 5 (first at line 1): a key may appear once in a "
         "mapping"),
        (["export", str(d / "empty.pt"), "--subnet", subnet, "--out", str(tmp_path / "e")],
         f"nas export: error: {d / 'empty.pt'}: not a readable supernet checkpoint (the file is empty: 0 bytes, a copy or a "
         "save that did not finish)"),
        (["export", str(d / "evil.pt"), "--subnet", subnet, "--out", str(tmp_path / "e")],
         f"nas export: error: {d / 'evil.pt'}: not a readable supernet checkpoint (it holds objects that need code to load, "
         "a pickle: refused, loading runs no code)"),
        (export + ["--out", afile], f"nas export: error: --out: {afile} is a file; expected a folder"),
        (["fit-predictor", "t.csv", "--out", afile], f"nas fit-predictor: error: --out: {afile} is a file; expected a folder"),
        (["search", ckpt, "--predictor", "p", "--budget", "1ms", "--out", afile],
         f"nas search: error: --out: {afile} is a file; expected a folder"),
        (["train-supernet", "tiny", "--out", afile], f"nas train-supernet: error: --out: {afile} is a file; expected a folder"),
        (["measure-latency", "tiny", "--device", "cpu", "--out", str(tmp_path)],
         f"nas measure-latency: error: --out: {tmp_path} is a folder; expected a file (the table)"),
        (["measure-latency", "tiny", "--device", "cpu", "--out", f"{afile}/t.csv"],
         f"nas measure-latency: error: --out: {afile}/t.csv: {afile} is a file, not a folder"),
        (["search", ckpt, "--predictor", files["pred"], "--budget", "1ms", "--timing-target", "bogus", "--out",
          str(tmp_path / "s")],
         "nas search: error: --timing-target: 'bogus' is not a device (available: cpu, cuda, onnxruntime, arm --bundle FILE, "
         "ssh://user@host)"),
        (["train-supernet", "tiny", "--out", str(tmp_path / "t"), "--lr", "nan"],
         "nas train-supernet: error: --lr: nan is not a finite number"),
        (["generate", "--model", str(tmp_path / "m"), "--temperature", "nan"],
         "nas generate: error: --temperature: nan is not a finite number"),
        (["generate", "--model", str(tmp_path / "m"), "--prompt", "caf\udce9"],
         "nas generate: error: --prompt: not UTF-8 text (b'caf\\xe9')"),
    ]
    for argv, expected in cases:
        assert one_error(capsys, argv) == expected, argv
    assert not any((tmp_path / n).exists() for n in ("e", "s", "t")), "a refused command wrote its --out"


def test_predictor_folder_is_checked_as_a_whole(files, tiny, tmp_path):
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(files["pred"], a)
    rng = np.random.default_rng(1)
    subnets = [tiny.sample(rng) for _ in range(20)]
    x, _ = subnet_matrix("additive", tiny, tiny.workload(), subnets)
    Predictor("additive", Additive().fit(x, 2 + x.sum(1) * 1e-8), tiny, tiny.workload(), {"device": "cpu"}).save(b)
    load_predictor(a)
    (a / "arrays.npz").write_bytes((b / "arrays.npz").read_bytes())  # arrays of another fit
    with pytest.raises(UserError, match=r"arrays.npz: checksum \w+\.\.\. does not match predictor.json \(\w+\.\.\.\): the "):
        load_predictor(a)
    doc = json.loads((a / "predictor.json").read_text())
    for name, data in (("truncated", (b / "arrays.npz").read_bytes()[:100]), ("other kind", _npz(w=np.zeros(3)))):
        (a / "arrays.npz").write_bytes(data)
        doc["files"]["arrays.npz"] = __import__("hashlib").sha256(data).hexdigest()  # a consistent folder, broken content
        (a / "predictor.json").write_text(json.dumps(doc))
        with pytest.raises(UserError) as e:
            load_predictor(a)
        assert str(e.value).startswith(f"{a / 'arrays.npz'}: "), name
        expected = "not a readable array file" if name == "truncated" else "does not hold the arrays of the additive model"
        assert expected in str(e.value)


def _npz(**arrays) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_reexport_removes_the_previous_runs_outputs_and_stale_parts_are_refused(files, tmp_path, capsys):
    out = tmp_path / "o"
    base = ["export", files["ckpt"], "--subnet", files["subnet"], "--no-eval", "--out", str(out)]
    assert main(base + ["--format", "torch,onnx"]) == 0
    assert (out / "model.onnx").exists()
    other = tmp_path / "s2.yaml"
    other.write_text(Subnet(96, 1, (2,), (256,), ("softmax",)).to_yaml())
    base[3] = str(other)
    assert main(base + ["--format", "torch"]) == 0
    capsys.readouterr()
    assert not (out / "model.onnx").exists()  # the previous subnet's graph is gone, not left beside the new weights
    assert load_model(out).subnet.embed_dim == 96
    (out / "model.onnx").write_bytes(b"left over")  # what an interrupted or older run leaves
    with pytest.raises(UserError, match=r"model.onnx: not listed in model_card.json \(left by another run, or by a run "):
        load_model(out)


# --------------------------------------------------------------------------- timing tables: torn lines, full disk, locks


def campaign(tiny, path, device=None, progress=None, memory_mb=2048.0, n=8):
    """test_latency_table's campaign (8 subnets + 2 re-measured on the fake device), by default in one chunk."""
    return latency_table_campaign(tiny, path, device=device, n=n, progress=progress, memory_mb=memory_mb)


def rows(path):
    with open(path, newline="") as f:
        return sorted(((r["key"], r["pass"], r["median_ms"], r["iqr_ms"]) for r in csv.DictReader(f)))


@pytest.fixture(scope="module")
def whole(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("whole") / "t.csv"
    campaign(tiny, path, memory_mb=1.0)
    return rows(path)


def test_ctrl_c_in_one_chunk_keeps_the_visits_done(tiny, tmp_path):
    """The default --memory-mb holds tiny's campaign in one chunk: an interrupt keeps its visits (the journal)."""
    path = tmp_path / "t.csv"

    def stop(done, total, info):
        if done >= 11:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        campaign(tiny, path, progress=stop)
    kept = [json.loads(line) for line in open(str(path) + ".visits")][1:]
    assert sum(e["k"].startswith("visit ") for e in kept) == 11 and not path.exists()
    again = FakeDevice()
    campaign(tiny, path, device=again)
    uninterrupted = FakeDevice()
    campaign(tiny, tmp_path / "u.csv", device=uninterrupted)
    assert rows(path) == rows(tmp_path / "u.csv")
    assert len(again.clock.log) < len(uninterrupted.clock.log)  # the 11 kept visits (and calibrations) were not timed again
    assert not Path(str(path) + ".visits").exists()


def test_torn_last_line_is_dropped_with_a_note_and_measured_again(tiny, tmp_path, whole, caplog):
    path = tmp_path / "t.csv"
    campaign(tiny, path, memory_mb=1.0)
    text = path.read_text()
    path.write_text(text[: len(text) - 25])  # a crash in the middle of the last row
    caplog.set_level("WARNING")
    assert len(read_timings(path).rows) == 9  # readers leave the torn line out
    assert "line 11 is torn" in caplog.text
    campaign(tiny, path, memory_mb=1.0)
    assert "dropped line 11, torn by an interrupted write" in caplog.text
    assert rows(path) == whole


def test_disk_full_during_an_append_leaves_the_table_whole(tiny, tmp_path, whole, monkeypatch):
    import latency.timing_core as core

    path = tmp_path / "t.csv"
    real = os.write
    calls = {"n": 0}

    def full_after_half(fd, data):
        if os.fstat(fd).st_size > 0 and str(path) == os.readlink(f"/proc/self/fd/{fd}"):
            calls["n"] += 1
            if calls["n"] == 2:  # the second chunk's rows: half of them reach the disk, then it is full
                real(fd, bytes(data[: len(data) // 2]))
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(core.os, "write", full_after_half)
    with pytest.raises(OSError) as e:
        campaign(tiny, path, memory_mb=1.0)
    monkeypatch.undo()
    args = build_parser().parse_args(["measure-latency", "tiny", "--device", "cpu", "--out", str(path)])
    assert io_failure(e.value, args) == (
        f"{path}: No space left on device: the disk is full: free some space or write elsewhere (--out); what was written "
        "before is kept"
    )
    text = path.read_text()
    assert text.endswith("\n") and len(read_timings(path).rows) >= 1  # whole rows only: the half append was cut back
    campaign(tiny, path, memory_mb=1.0)
    assert rows(path) == whole


def test_a_second_writer_is_refused_and_a_dead_writers_lock_is_released(tiny, tmp_path):
    path = tmp_path / "t.csv"
    w = tiny.workload()
    meta = make_meta(FakeDevice().fingerprint(), tiny, w, SETTINGS.to_dict(), 0, list(table_features(tiny, SUBNET, w)))
    first = TimingTable(path, dict(meta))
    with pytest.raises(UserError, match=rf"^{path}: another measure-latency is writing this table \(pid {os.getpid()} on .+\); "
                                        "wait for it to end or use another --out$"):
        TimingTable(path, dict(meta))
    first.close()
    TimingTable(path, dict(meta)).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); from latency.table import lock_file; "
         f"from pathlib import Path; f = lock_file(Path({str(path) + '.lock'!r}), 'busy'); print('held', flush=True); "
         "import time; time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(UserError, match=rf"pid {holder.pid} on"):
        TimingTable(path, dict(meta))
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    TimingTable(path, dict(meta)).close()  # the dead process holds nothing



def test_the_locks_are_filelock_s_and_no_module_imports_fcntl(tmp_path):
    """The locks (timing tables, the kernels' build) are ``filelock``'s, which picks the platform's mechanism: ``fcntl``
    exists on POSIX only, so no module of the toolkit imports it (lazily either)."""
    import ast

    from latency.table import lock_file, unlock_file

    found = []
    for package in ("search_spaces", "supernet", "latency", "tasks", "nas", "scripts"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                found += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names if n.split(".")[0] == "fcntl"]
    assert found == []
    from filelock import BaseFileLock

    lock = lock_file(tmp_path / "t.csv.lock", "busy")
    assert isinstance(lock, BaseFileLock) and lock.is_locked
    assert (tmp_path / "t.csv.lock").read_text() == f"pid {os.getpid()} on {socket.gethostname()}\n"
    unlock_file(lock)
    assert not lock.is_locked and not (tmp_path / "t.csv.lock").exists()


KILLED_CAMPAIGN = """
import sys, time
sys.path.insert(0, {root!r})
from search_spaces import load_space
from tests.latency.latency_fakes import FakeDevice
from tests.nas.test_reliability import campaign
def slow(done, total, info):
    print(done, flush=True)
    time.sleep(0.03)
campaign(load_space("tiny"), {path!r}, progress=slow, memory_mb={memory_mb})
print("finished", flush=True)
"""


@pytest.mark.parametrize("memory_mb", [2048.0, 1.0])
def test_kill_9_at_random_points_of_a_campaign_resumes_to_the_uninterrupted_table(tiny, tmp_path, whole, memory_mb):
    path = tmp_path / "t.csv"
    script = KILLED_CAMPAIGN.format(root=str(ROOT), path=str(path), memory_mb=memory_mb)
    rng = np.random.default_rng(int(memory_mb))
    for _ in range(2):
        p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert p.stdout.readline().strip()  # the first visit is done: the campaign runs
        time.sleep(float(rng.uniform(0.0, 0.4)))
        p.send_signal(signal.SIGKILL)
        p.wait()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip().endswith("finished"), done.stderr
    assert rows(path) == whole
    assert not Path(str(path) + ".visits").exists()


# --------------------------------------------------------------------------- a real full disk (tmpfs)


@pytest.fixture
def full_disk(tmp_path):
    """A 512 KB tmpfs, filled to the last byte; skipped where this process may not mount one."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the OSError-shim tests cover the write sites")
    try:
        fill(mnt / "filler")
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path) -> None:
    try:
        with open(path, "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
    except OSError:
        pass


def test_a_full_disk_is_one_line_naming_the_path_at_every_write_site(full_disk, files, tiny, tmp_path, capsys):
    assert one_error(capsys, ["measure-latency", "-q", "tiny", "--device", "cpu", "--samples", "2", "--out",
                              str(full_disk / "t.csv")]).startswith(
        f"nas measure-latency: error: {full_disk / 't.csv.json'}: No space left on device: the disk is full")
    table = tmp_path / "t.csv"
    campaign(tiny, table, n=16)
    line = one_error(capsys, ["fit-predictor", "-q", str(table), "--out", str(full_disk / "p"), "--models", "additive"])
    assert line.startswith(f"nas fit-predictor: error: {full_disk / 'p'}") and "No space left on device" in line
    line = one_error(capsys, ["export", "-q", files["ckpt"], "--subnet", files["subnet"], "--no-eval",
                              "--out", str(full_disk / "e")])
    assert line.startswith(f"nas export: error: {full_disk / 'e'}: No space left on device: the exported model needs about ")
    val = tmp_path / "val.txt"
    val.write_text((Path(json.__file__).read_text() * 3)[:60000])
    line = one_error(capsys, ["search", "-q", files["ckpt"], "--predictor", files["pred"], "--budget", "2ms", "--population", "4",
                              "--parents", "2", "--mutations", "2", "--crossovers", "2", "--generations", "2", "--val-data",
                              str(val), "--val-windows", "2", "--seq-len", "32", "--out", str(full_disk / "s")])
    assert line == (f"nas search: error: --storage: cannot open 'sqlite:///{full_disk / 's' / 'search.db'}': "
                    "(sqlite3.OperationalError) database or disk is full")  # a full disk later in the search: see the README
    args = build_parser().parse_args(["train-supernet", "tiny", "--out", str(full_disk)])
    with pytest.raises(Exception) as e:
        save_checkpoint(full_disk / "latest.pt", SuperTransformer(tiny), {}, step=1)
    assert io_failure(e.value, args).startswith(f"{full_disk / 'latest.pt'}: No space left on device: the disk is full")
    # no temporary or half file left behind (the empty folders made, and the empty database SQLite opened, stay)
    assert [p.name for p in full_disk.rglob("*") if p.is_file() and p.name not in ("filler", "search.db")] == []
    ro = tmp_path / "ro"  # a read-only disk: a tmpfs of its own (remounting this one read-only fails while the search's
    ro.mkdir()  # database, which the failed search opened in this process, is still open for writing)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], check=True)
    try:
        assert one_error(capsys, ["fit-predictor", str(table), "--out", str(ro / "p2")]) == (
            f"nas fit-predictor: error: --out: {ro / 'p2'}: {ro} is not writable (read-only or no permission); "
            "write elsewhere")
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)
    # a disk that fills during a search: the storage opens, later trials cannot be written
    subprocess.run(["mount", "-o", "remount,rw,size=4m", str(full_disk)], check=True)
    search = ["search", "-q", files["ckpt"], "--predictor", files["pred"], "--budget", "2ms", "--population", "4",
              "--parents", "2", "--mutations", "2", "--crossovers", "2", "--val-data", str(val), "--val-windows", "2",
              "--seq-len", "32", "--out", str(full_disk / "s2")]
    assert main(search + ["--generations", "1"]) == 0
    fill(full_disk / "filler2")
    capsys.readouterr()
    assert one_error(capsys, search + ["--generations", "3"]) == (
        f"nas search: error: {full_disk / 's2' / 'search.db'}: No space left on device: the disk is full: free some space or "
        "write elsewhere (--out); what was written before is kept")


# --------------------------------------------------------------------------- sizes checked before allocation, temporary files


def test_a_huge_subnet_is_refused_before_allocation_and_dead_runs_temporary_folders_are_swept(tmp_path, capsys):
    import tempfile

    from latency.timing_core import TEMP_PREFIX, sweep_temp_dirs

    huge = space_file(tmp_path, "huge", embed="[65536]", depth="[256]")
    Path(huge).write_text(Path(huge).read_text().replace("ffn_dim: [64]", "ffn_dim: [262144]"))
    line = one_error(capsys, ["measure-latency", "-q", huge, "--device", "cpu", "--samples", "2", "--retest", "0",
                              "--out", str(tmp_path / "t.csv")])
    assert line.startswith("nas measure-latency: error: the weights of 1 subnet(s) need 33,563,329 MB, ")
    assert line.endswith("(the largest: d65536 L256 [256x 2h/262144/softmax], 8,798,425,210,880 parameters); lower "
                         "--memory-mb or time a space of smaller models")
    assert not (tmp_path / "t.csv.visits").exists() and not (tmp_path / "t.csv").exists()  # refused before timing anything
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{int(dead.stdout)}-"))  # what a kill -9 of that process leaves
    (stale / "model.weights").write_bytes(b"\0" * 1024)
    mine = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-"))
    sweep_temp_dirs()
    assert not stale.exists() and mine.exists()
    mine.rmdir()


KILLED_EXPORT = """
import sys
sys.path.insert(0, {root!r})
from nas.cli import main
sys.exit(main({argv!r}))
"""


def test_kill_9_during_an_export_leaves_a_folder_that_loads_whole_or_is_refused_and_a_rerun_is_whole(files, tmp_path):
    from safetensors.torch import load_file

    whole, out = tmp_path / "whole", tmp_path / "o"
    argv = ["export", "-q", files["ckpt"], "--subnet", files["subnet"], "--no-eval", "--format", "torch,onnx"]
    assert main(argv + ["--out", str(whole)]) == 0
    other = tmp_path / "s2.yaml"
    other.write_text(Subnet(96, 2, (2, 1), (256, 128), ("softmax", "linear")).to_yaml())
    assert main(argv[:4] + [str(other), *argv[5:], "--out", str(out)]) == 0  # an earlier export of another subnet there
    before = (out / "model_card.json").read_text()
    script = KILLED_EXPORT.format(root=str(ROOT), argv=argv + ["--out", str(out)])
    rng = np.random.default_rng(3)
    for _ in range(1):
        p = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
        time.sleep(float(rng.uniform(3.0, 8.0)))  # imports take about 3 s; the export itself a few seconds
        p.send_signal(signal.SIGKILL)
        p.wait()
        try:  # never the previous subnet's files under the new card, nor a half file that loads
            model = load_model(out)
        except UserError:
            continue
        # the new export whole, or (killed before it replaced anything: a loaded machine) the earlier one untouched
        assert model.subnet == SUBNET or (model.subnet == Subnet.from_yaml(other.read_text())
                                          and (out / "model_card.json").read_text() == before)
    assert main(argv + ["--out", str(out)]) == 0
    assert load_model(out).subnet == SUBNET
    card, expected = (json.loads((d / "model_card.json").read_text())["files"] for d in (out, whole))
    assert sorted(card) == sorted(expected) and all(card[n] == expected[n] for n in ("model.safetensors", "model.onnx"))
    assert all(torch.equal(a, b) for a, b in zip(load_file(out / "model.safetensors").values(),
                                                 load_file(whole / "model.safetensors").values()))


# --------------------------------------------------------------------------- hostile YAML: bounded before it is parsed

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))  # 9**9 strings once expanded


def test_hostile_yaml_is_refused_before_it_is_parsed_whole(files, tmp_path, capsys):
    """Aliases, oversized files, files that are no files, deep nesting, huge numbers: one short line each, exit 2."""
    from search_spaces.yamlio import MAX_YAML_BYTES

    tiny_yaml = (ROOT / "search_spaces" / "tiny.yaml").read_text()
    (tmp_path / "bomb.yaml").write_text(BOMB)
    (tmp_path / "aliased.yaml").write_text(tiny_yaml.replace("name: tiny", "name: &n tiny\nlayers_alias: *n"))
    (tmp_path / "comment.yaml").write_text("# " + "x" * (MAX_YAML_BYTES + 10) + "\n" + tiny_yaml)
    with open(tmp_path / "sparse.yaml", "wb") as f:
        f.truncate(50 * 2**20)  # 50 MB that reading would take seconds over, parsing minutes
    (tmp_path / "deep.yaml").write_text("embed_dim: " + "[" * 5000 + "]" * 5000 + "\n")
    (tmp_path / "digits.yaml").write_text("vocab_size: " + "9" * 5000 + "\n")
    os.mkfifo(tmp_path / "fifo.yaml")  # reading it would block until a writer came
    (tmp_path / "folder.yaml").mkdir()
    (tmp_path / "subnet.yaml").write_text(Path(files["subnet"]).read_text() + "x: &s 1\ny: *s\n")
    space = [
        ("bomb.yaml", "line 2, column 8: an alias (*a): aliases are not accepted (they can expand a few lines into "
                      "gigabytes); write the value out"),
        ("aliased.yaml", "an alias (*n): aliases are not accepted"),
        ("comment.yaml", f"{MAX_YAML_BYTES + 10 + 3 + len(tiny_yaml):,} bytes; a search space is at most "
                         f"{MAX_YAML_BYTES:,} bytes"),
        ("sparse.yaml", f"{50 * 2**20:,} bytes; a search space is at most {MAX_YAML_BYTES:,} bytes"),
        ("deep.yaml", "line 1, column 75: nested deeper than 64 levels"),
        ("digits.yaml", "not valid YAML (Exceeds the limit (4300 digits) for integer string conversion"),
        ("fifo.yaml", "not a regular file; expected a search space (a UTF-8 YAML file)"),
        ("folder.yaml", "a folder; expected a search space (a UTF-8 YAML file)"),
    ]
    for name, expected in space:
        line = one_error(capsys, ["space", str(tmp_path / name)])
        where = name if name in ("bomb.yaml", "aliased.yaml", "deep.yaml", "digits.yaml") else tmp_path / name
        assert line.startswith(f"nas space: error: {where}: ") and expected in line and len(line) < 300, line
    line = one_error(capsys, ["export", files["ckpt"], "--subnet", str(tmp_path / "subnet.yaml"),
                              "--out", str(tmp_path / "e")])
    assert "subnet.yaml: line 7, column 4: an alias (*s): aliases are not accepted" in line, line
    assert not (tmp_path / "e").exists()


def test_values_quoted_in_messages_are_cut(tmp_path, capsys):
    """A value a file gives is quoted in a few dozen characters, however large it is."""
    text = SPACE.format(embed="[32, 64]", depth="[1, 2]")
    cases = {
        "long-string": (("name: t", f"name: [{'x' * 200000}]"),
                        "name: ['xxxxxxxxxxxxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxxxxxxxxxxxx'] is not a non-empty string"),
        "long-mapping": (("embed_dim: [32, 64]", "embed_dim: {" + ", ".join(f"k{i}: {i}" for i in range(10000)) + "}"),
                         "embed_dim: expected a non-empty list of positive integers, got {'k0': 0, 'k1': 1, 'k10': 10, "
                         "'k100': 100, ...}"),
        "huge-int": (("embed_dim: [32, 64]", "embed_dim: [" + "9" * 4000 + "]"),
                     "embed_dim[0]: 999999999999999999...9999999999999999999 is above the limit of 65,536 for embed_dim"),
        "long-key": (("depth:", f"? {'k' * 100000}\n: 1\ndepth:"),  # (an explicit key: a plain one is at most 1024)
                     "long-key.yaml: 'kkkkkkkkkkkkkkkkkkkkkkkkkkk...kkkkkkkkkkkkkkkkkkkkkkkkkkkk': unknown key (allowed: task, "),
    }
    for name, ((old, new), expected) in cases.items():
        path = tmp_path / f"{name}.yaml"
        assert old in text
        path.write_text(text.replace(old, new, 1))
        line = one_error(capsys, ["space", str(path)])
        assert expected in line and len(line) < 250, (name, line[:400])
    path = tmp_path / "many.yaml"  # every problem is found; ten are said, then how many more
    path.write_text(text.replace("embed_dim: [32, 64]", "embed_dim: " + str(["w"] * 20000)))
    assert main(["space", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "nas space: error: many.yaml: embed_dim[0]: 'w' is not a positive integer"
    assert len(err) == 11 and err[-1] == "(and 19,990 more problems of the same file)", err[-3:]


# --------------------------------------------------------------------------- the umask: files others may read


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002])
def test_atomic_writes_respect_the_umask_and_keep_a_replaced_files_mode(tmp_path, mask):
    from supernet.files import atomic_write, temp_dir, umask

    old = os.umask(mask)
    try:
        assert umask() == mask
        new = atomic_write(tmp_path / "new.json", "{}")
        assert (new.stat().st_mode & 0o777) == 0o666 & ~mask
        kept = tmp_path / "kept.json"
        for mode in (0o644, 0o640, 0o600):  # a rewrite keeps what the file was, whatever the umask
            kept.write_text("old")
            kept.chmod(mode)
            atomic_write(kept, "new")
            assert (kept.stat().st_mode & 0o777) == mode and kept.read_text() == "new"
        target = tmp_path / "target"
        target.write_text("theirs")
        target.chmod(0o600)
        (tmp_path / "link.json").symlink_to(target)  # a link is replaced by a file of the umask's mode, its target untouched
        atomic_write(tmp_path / "link.json", "ours")
        assert not (tmp_path / "link.json").is_symlink() and (tmp_path / "link.json").stat().st_mode & 0o777 == 0o666 & ~mask
        assert target.read_text() == "theirs" and target.stat().st_mode & 0o777 == 0o600
        assert (temp_dir(".x.", tmp_path).stat().st_mode & 0o777) == 0o777 & ~mask
    finally:
        os.umask(old)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_cached_graph_folder_respects_the_umask_and_a_failed_build_leaves_nothing(tmp_path):
    """latency.onnx_graphs.folder_once (the ONNX graph cache's folders, shared with other users of the cache): 0777
    less the umask, not mkdtemp's 0700; a build that fails leaves no folder and no temporary one; a present folder
    is read, never rebuilt."""
    from latency.onnx_graphs import folder_once

    old = os.umask(0o027)
    try:
        with pytest.raises(ZeroDivisionError):
            folder_once(tmp_path / "broken", lambda tmp: 1 / 0)
        assert list(tmp_path.iterdir()) == []
        layout = folder_once(tmp_path / "g", lambda tmp: (tmp / "layout.json").write_text('{"tensors": 3}'))
    finally:
        os.umask(old)
    assert layout == {"tensors": 3} and (tmp_path / "g").stat().st_mode & 0o777 == 0o750
    assert [p.name for p in tmp_path.iterdir()] == ["g"]
    assert folder_once(tmp_path / "g", lambda tmp: 1 / 0) == layout


def test_every_file_a_command_writes_respects_the_umask(files, tiny, tmp_path, capsys):
    """Under umask 027: an export (weights, card, subnet, model.pt2), a predictor (json, arrays, PNG, report), a supernet
    run (checkpoints, log, corpus cache), each file 0640 and each folder 0750."""
    table = tmp_path / "t.csv"
    campaign(tiny, table, n=16)
    data = tmp_path / "corpus.txt"
    data.write_text((Path(json.__file__).read_text() * 2)[:40000])
    old = os.umask(0o027)
    try:
        assert main(["export", "-q", files["ckpt"], "--subnet", files["subnet"], "--no-eval",
                     "--format", "torch", "--out", str(tmp_path / "w" / "export")]) == 0
        assert main(["fit-predictor", "-q", str(table), "--models", "additive", "--out", str(tmp_path / "w" / "pred")]) == 0
        assert main(["train-supernet", "-q", "tiny", "--data", str(data), "--max-steps", "2", "--batch-size", "2",
                     "--seq-len", "32", "--eval-batches", "1", "--out", str(tmp_path / "w" / "run")]) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    written = list((tmp_path / "w").rglob("*"))
    names = {p.name for p in written}
    assert {"model.safetensors", "model_card.json", "subnet.yaml", "model.pt2", "predictor.json", "arrays.npz",
            "predicted_vs_measured.png", "report.txt", "latest.pt", "final.pt", "log.jsonl", "train.bin"} <= names, names
    wrong = [(str(p.relative_to(tmp_path)), oct(p.stat().st_mode & 0o777)) for p in written
             if p.stat().st_mode & 0o777 != (0o750 if p.is_dir() else 0o640)]
    assert wrong == []


# --------------------------------------------------------------------------- token budgets: exact integers under a cap


def test_token_budgets_are_exact_integers_under_a_cap(files, tmp_path, capsys):
    from nas.search.budget import MAX_TOKENS, parse_count

    out = tmp_path / "t"
    train = ["train-subnet", files["subnet"], "--space", "tiny", "--out", str(out)]
    cap = f"is above the limit of {MAX_TOKENS:,} tokens"
    forms = "write a whole number of tokens, optionally with a suffix K, M or G (powers of 1000): 20M, 500k, 1.5G"
    for tokens, expected in [("1e30", cap), ("1e12k", cap), ("1000000000001", cap), ("12345678901234567891", cap),
                             ("1e999999999", cap), ("0.5", f"is not a whole number of tokens; {forms}"),
                             ("1e-999999999", f"is not a whole number of tokens; {forms}"),
                             ("nan", f"is not a token budget; {forms}"), ("inf", f"is not a token budget; {forms}"),
                             ("-20M", f"must be greater than zero; {forms}")]:
        assert one_error(capsys, train + [f"--tokens={tokens}"]) == f"nas train-subnet: error: --tokens: {tokens!r} {expected}"
    search = ["search", files["ckpt"], "--predictor", files["pred"], "--budget", "1ms", "--hurdles", "2",
              "--out", str(tmp_path / "s"), "--hurdle-tokens"]
    assert one_error(capsys, search + ["1e30"]) == f"nas search: error: --hurdle-tokens: '1e30' {cap}"
    assert not out.exists() and not (tmp_path / "s").exists()
    assert parse_count("12345678901234567891") == 12345678901234567891  # exact: no float in between
    assert parse_count("1.5G", "--tokens", "tokens", limit=MAX_TOKENS) == 1_500_000_000
    assert parse_count("1e12", "--tokens", "tokens", limit=MAX_TOKENS) == MAX_TOKENS


# --------------------------------------------------------------------------- text that is not UTF-8, wherever it is given


def test_text_that_is_not_utf8_is_one_line_wherever_it_is_given(files, tmp_path, capsys):
    """Positional texts (classify, translate), repeated flags and single flags: each argument is checked, one line naming
    it, before any model is loaded (the models named here do not exist: the check comes first)."""
    m = str(tmp_path / "m")
    cases = [
        (["classify", "--model", m, "the\udcffdog"], "nas classify: error: TEXT 1: not UTF-8 text (b'the\\xffdog')"),
        (["classify", "--model", m, "fine", "fine", "caf\udce9"], "nas classify: error: TEXT 3: not UTF-8 text (b'caf\\xe9')"),
        (["translate", "--model", m, "the\udcffdog"], "nas translate: error: TEXT 1: not UTF-8 text (b'the\\xffdog')"),
        (["translate", "--model", m, "ok", "\udc80"], "nas translate: error: TEXT 2: not UTF-8 text (b'\\x80')"),
        (["fit-predictor", "t.csv", "--from", "a", "--from", "b\udcff", "--out", str(tmp_path / "p")],
         "nas fit-predictor: error: --from (the second): not UTF-8 text (b'b\\xff')"),
        (["generate", "--model", m, "--prompt", "\udcc3("], "nas generate: error: --prompt: not UTF-8 text (b'\\xc3(')"),
    ]
    for argv, expected in cases:
        assert one_error(capsys, argv) == expected
    assert not (tmp_path / "p").exists()
    # and through the real entry point, where the bytes arrive from the shell as they are
    done = subprocess.run([sys.executable, "-m", "nas", "classify", "--model", m, b"the\xffdog"], capture_output=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and done.stderr == b"nas classify: error: TEXT 1: not UTF-8 text (b'the\\xffdog')\n"


# --------------------------------------------------------------------------- an --out that is an input


def test_an_out_that_is_one_of_the_inputs_is_refused_and_the_input_kept(files, tiny, tmp_path, capsys):
    import hashlib
    import shutil

    pred = tmp_path / "pred"
    shutil.copytree(files["pred"], pred)
    (tmp_path / "link").symlink_to(pred)
    table = tmp_path / "t.csv"
    campaign(tiny, table, n=16)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in pred.iterdir()}
    space = tmp_path / "space.yaml"
    space.write_text((ROOT / "search_spaces" / "tiny.yaml").read_text())
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("some text\n" * 100)
    overwrite = "writing there would overwrite what the command reads: choose another --out"
    cases = [
        (["fit-predictor", str(table), "--from", str(pred), "--out", str(pred)],
         f"nas fit-predictor: error: --out {pred}: is the source predictor (--from {pred}); {overwrite}"),
        (["fit-predictor", str(table), "--from", files["pred"], "--from", str(pred), "--out", str(tmp_path / "link")],
         f"nas fit-predictor: error: --out {tmp_path / 'link'}: is the source predictor (--from {pred}); {overwrite}"),
        (["fit-predictor", str(table), "--from", str(tmp_path / "link"), "--out", f"{pred}/."],
         f"nas fit-predictor: error: --out {pred}: is the source predictor (--from {tmp_path / 'link'}); {overwrite}"),
        (["measure-latency", str(space), "--device", "cpu", "--out", str(space)],
         f"nas measure-latency: error: --out {space}: is the source search space (SPACE {space}); {overwrite}"),
        (["train-supernet", "tiny", "--data", str(corpus), "--out", str(corpus)],
         f"nas train-supernet: error: --out {corpus}: is the source corpus (--data {corpus}); {overwrite}"),
        (["finetune", "--model", str(pred), "--out", str(pred)],
         f"nas finetune: error: --out {pred}: is the source model directory (--model {pred}); {overwrite}"),
        (["train-subnet", files["subnet"], "--space", "tiny", "--init", f"model:{pred}", "--out", str(pred)],
         f"nas train-subnet: error: --out {pred}: is the source model directory (--init model:{pred}); {overwrite}"),
    ]
    for argv, expected in cases:
        assert one_error(capsys, argv) == expected
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in pred.iterdir()} == before
    assert sorted(p.name for p in corpus.iterdir()) == ["a.txt"]
    assert space.read_text() == (ROOT / "search_spaces" / "tiny.yaml").read_text()


# --------------------------------------------------------------------------- ssh:// devices: the URL first, never an option


SSH_FORMS = "write ssh://user@host, ssh://host or ssh://user@host:port"
PLAIN = "that is not a plain name (letters, digits, . _ -; not starting with -)"


def test_ssh_urls_are_checked_before_any_bundle_and_never_reach_ssh_as_options(tmp_path, capsys, monkeypatch):
    import tempfile

    import latency.devices.arm as arm

    built = []
    monkeypatch.setattr(arm, "write_bundle", lambda *a, **k: built.append(a))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    cases = {
        "ssh://-F/tmp/evil": f"has a host name '-F/tmp/evil' {PLAIN}",
        "ssh://-oProxyCommand=touch@x": f"has a user name '-oProxyCommand=touch' {PLAIN}",
        "ssh://u@-oProxyCommand=x": f"has a host name '-oProxyCommand=x' {PLAIN}",
        "ssh://user@": "has an empty host name",
        "ssh://@host": "has an empty user name",
        "ssh://": "names no host",
        "ssh://host:99999": "has a port '99999' that is not a number from 1 to 65535",
        "ssh://host:0": "has a port '0' that is not a number from 1 to 65535",
        "ssh://host:": "has a port '' that is not a number from 1 to 65535",
        "ssh://host:２２": "has a port '２２' that is not a number from 1 to 65535",
        "ssh://h$(id)": f"has a host name 'h$(id)' {PLAIN}",
        "ssh://host/path": f"has a host name 'host/path' {PLAIN}",
        "ssh://[::1": "has an address '[::1' without its closing bracket",
        "ssh://[::1]x": "has 'x' after the address",
    }
    for url, expected in cases.items():
        line = one_error(capsys, ["measure-latency", "tiny", "--device", url, "--out", str(tmp_path / "t.csv")])
        assert line == f"nas measure-latency: error: --device: {url!r} {expected}; {SSH_FORMS}", url
    assert one_error(capsys, ["search", "ck.pt", "--predictor", "p", "--timing-target", "ssh://-Fx", "--out",
                              str(tmp_path / "s")]) \
        == f"nas search: error: --timing-target: 'ssh://-Fx' has a host name '-Fx' {PLAIN}; {SSH_FORMS}"
    assert built == [] and list((tmp_path / "tmp").iterdir()) == [] and not (tmp_path / "t.csv").exists()
    for url, parts in {"ssh://user@host:2222": ("user", "host", 2222), "ssh://board": (None, "board", None),
                       "ssh://pi@[fe80::1]:22": ("pi", "[fe80::1]", 22),
                       "ssh://a.b-c_d@10.0.0.1": ("a.b-c_d", "10.0.0.1", None)}.items():
        t = arm.parse_target(url)
        assert (t.user, t.host, t.port) == parts


def test_ssh_gets_the_port_as_its_option_and_the_host_as_a_host(tmp_path, monkeypatch):
    """A fake ssh / scp that records its arguments: the port goes as -p / -P, the host never as an option."""
    import io
    import tarfile

    from latency.devices.arm import ROOT as BUNDLE_ROOT
    from latency.devices.arm import run_remote

    bundle = tmp_path / "b.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        info = tarfile.TarInfo(f"{BUNDLE_ROOT}/manifest.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    log = tmp_path / "argv"
    for name in ("ssh", "scp"):
        (tmp_path / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexit 255\n')
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("NAS_SSH", str(tmp_path / "ssh"))
    monkeypatch.setenv("NAS_SCP", str(tmp_path / "scp"))
    with pytest.raises(UserError, match=r"^--device ssh://pi@\[fe80::1\]:2222: ssh could not reach pi@\[fe80::1\] \(creating"):
        run_remote("ssh://pi@[fe80::1]:2222", bundle, tmp_path / "t.csv", workdir="/r")
    assert log.read_text().split()[:3] == ["ssh", "-p", "2222"] and log.read_text().split()[3] == "pi@fe80::1"


def test_an_ssh_run_that_fails_leaves_no_temporary_bundle(tmp_path, capsys, monkeypatch, graph_cache):
    import tempfile

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "ssh").write_text("#!/bin/sh\necho 'ssh: connect to host board port 22: Connection refused' >&2\nexit 255\n")
    (tmp_path / "ssh").chmod(0o755)
    monkeypatch.setenv("NAS_SSH", str(tmp_path / "ssh"))
    assert main(["measure-latency", "-q", "tiny", "--device", "ssh://board", "--samples", "2", "--retest", "0",
                 "--out", str(tmp_path / "t.csv")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]  # (after the small-sample warnings)
    assert errors == ["nas measure-latency: error: --device ssh://board: ssh could not reach board (creating the remote "
                      "folder): ssh: connect to host board port 22: Connection refused"]
    left = [p.name for p in (tmp_path / "tmp").iterdir() if not p.name.startswith("torchinductor_")]  # (torch's own cache)
    assert left == [] and not (tmp_path / "t.csv").exists()


# --------------------------------------------------------------------------- messages that name the real problem


def test_a_long_csv_cell_is_read_and_a_folder_is_not_called_missing(tmp_path):
    from nas.classify import read_csv_text, read_labelled_csv, text_bytes

    long = "word " * 200_000  # 1M characters in one cell: valid CSV; texts are cut to the model's window
    path = tmp_path / "long.csv"
    path.write_text(f'text,label\n"{long}",a\nshort,b\nother,a\nmore,b\n')
    data = read_labelled_csv(path)
    assert data.texts[0] == long and list(data.labels) == ["a", "b", "a", "b"]
    assert text_bytes(data.texts[:1], 64) == [long.encode()[:64]]
    path.write_text(f'text,label\nshort,a\n"{long}",\nother,a\nmore,b\n')
    with pytest.raises(UserError, match=r"long.csv: line 3: empty label in column 'label'$"):  # the file's line, not 1
        read_labelled_csv(path)
    (tmp_path / "folder.csv").mkdir()
    os.mkfifo(tmp_path / "fifo.csv")
    for name, what in (("folder.csv", "a folder"), ("fifo.csv", "not a regular file"), ("missing.csv", "no such file")):
        with pytest.raises(UserError) as e:
            read_csv_text(tmp_path / name)
        assert str(e.value) == f"--data {tmp_path / name}: {what} (expected a UTF-8 CSV file with a header row)"


@pytest.fixture(scope="module")
def translation_run(tmp_path_factory):
    """A train-supernet run (one step) of the mini encoder-decoder space on the toy pairs."""
    from tests.tasks.translation.translation_fakes import MINI_SEQ2SEQ, write_toy_tsv

    d = tmp_path_factory.mktemp("s2s")
    (d / "mini.yaml").write_text(MINI_SEQ2SEQ.format(positions="rope"))
    assert main(["train-supernet", "-q", str(d / "mini.yaml"), "--data", str(write_toy_tsv(d / "toy.tsv")),
                 "--max-steps", "1", "--batch-size", "2", "--eval-batches", "1", "--out", str(d / "run")]) == 0
    return d


def test_a_subnet_or_supernet_of_another_task_names_the_space_as_the_problem(translation_run, tmp_path, capsys):
    """A decoder-only subnet with an encoder-decoder space (and the reverse), an encoder-decoder supernet as --init of
    a causal-lm space: the space is named as what does not fit, not a command to run."""
    from search_spaces import Subnet as Plain
    from tasks.translation.space import TranslationSubnet

    from tests.tasks.translation.translation_fakes import mini_space

    (tmp_path / "causal.yaml").write_text(SUBNET.to_yaml())
    (tmp_path / "s2s.yaml").write_text(mini_space().largest().to_yaml())
    with pytest.raises(UserError, match=r"^causal.yaml: a decoder-only subnet \(keys embed_dim, depth, heads, ffn_dim, "
                                        r"attention\), not one of this encoder-decoder space .*: the subnet is of another "
                                        r"space$"):
        TranslationSubnet.load(tmp_path / "causal.yaml")
    with pytest.raises(UserError, match=r"^s2s.yaml: an encoder-decoder's subnet \(keys encoder and decoder\), not one of "
                                        r"this decoder-only space .*: the subnet is of another space$"):
        Plain.load(tmp_path / "s2s.yaml")
    capsys.readouterr()
    ckpt = translation_run / "run" / "final.pt"
    line = one_error(capsys, ["train-subnet", str(tmp_path / "causal.yaml"), "--space", "tiny", "--init", f"supernet:{ckpt}",
                              "--out", str(tmp_path / "t")])
    assert line.startswith(f"nas train-subnet: error: --init supernet:{ckpt}: trained on space 'mini-s2s' (arch hash ")
    assert line.endswith(": it is a seq2seq supernet and --space a causal-lm space; give the supernet's own space "
                         "('mini-s2s') as --space, and a subnet of it")
    assert "nas train-subnet --init" not in line and not (tmp_path / "t").exists()


def test_a_type_confused_predictor_json_is_blamed_not_the_intact_arrays(files, tiny, tmp_path):
    import shutil

    from latency.predictors.mlp import MLP

    rng = np.random.default_rng(2)
    subnets = [tiny.sample(rng) for _ in range(20)]
    x, _ = subnet_matrix("mlp", tiny, tiny.workload(), subnets)
    mlp = MLP(hidden=4, layers=1, max_iter=20).fit(x, 1 + x.sum(1) * 1e-3)
    Predictor("mlp", mlp, tiny, tiny.workload(), {"device": "cpu"}).save(tmp_path / "mlp")
    variants = [  # (predictor, a change to its JSON), what the message says
        (("pred", "model_state.names", 5), "model_state.names: 5; expected null or a list of strings"),
        (("pred", "model_state", "x"), "model_state: 'x'; expected a mapping"),
        (("pred", "reference_ms", "fast"), "reference_ms: 'fast'; expected null or a number"),
        (("pred", "columns", {"a": 1}), "columns: {'a': 1}; expected null or a list of strings"),
        (("mlp", "model_state.layers", "2"), "model_state.layers: '2'; expected a whole number"),
        (("mlp", "model_state.y_mean", [1.0]), "model_state.y_mean: [1.0]; expected a number"),
        (("mlp", "model_state.hidden", True), "model_state.hidden: True; expected a whole number"),
        (("mlp", "model_state.alpha", None), "model_state.alpha: None; expected a number"),
    ]
    for (which, field, value), expected in variants:
        folder = tmp_path / "edited"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(files["pred"] if which == "pred" else tmp_path / "mlp", folder)
        doc = json.loads((folder / "predictor.json").read_text())
        *parents, last = field.split(".")
        target = doc
        for name in parents:
            target = target[name]
        target[last] = value
        (folder / "predictor.json").write_text(json.dumps(doc))
        with pytest.raises(UserError) as e:
            load_predictor(folder)
        message = str(e.value)
        assert message == f"{folder / 'predictor.json'}: not the predictor file this tool writes: {expected}", message
        assert "arrays.npz" not in message
    load_predictor(tmp_path / "mlp")  # the untouched one loads


# --------------------------------------------------------------------------- resume after kill -9: exact, whatever the flags

WATCHED = """
import os, signal, sys
sys.path.insert(0, {root!r})
import torch
KILL_AT, SIGNAL = {kill_at!r}, {signal!r}


def watched(fn, step_of):
    def call(*args, progress=None, **kwargs):
        def seen(*a):
            if progress is not None:
                progress(*a)
            step = step_of(*a)
            print(f"step {{step}} threads {{torch.get_num_threads()}}", flush=True)
            if step == KILL_AT:
                os.kill(os.getpid(), SIGNAL)
        return fn(*args, progress=seen, **kwargs)
    return call


import latency.campaign, latency.device, nas.classify, supernet.train
supernet.train.train = watched(supernet.train.train, lambda info: info.step)
nas.classify.finetune_classifier = watched(nas.classify.finetune_classifier, lambda info: info.step)
latency.campaign.run_campaign = watched(latency.campaign.run_campaign, lambda done, total, info: done)
from tests.latency.latency_fakes import FakeDevice
latency.device.get_device = lambda name, **options: FakeDevice(threads=options.get("threads") or 0)  # a clock of its own
from nas.cli import main
sys.exit(main({argv!r}))
"""


def watched_run(argv: list[str], kill_at: int | None = None, sig: int = signal.SIGKILL) -> subprocess.CompletedProcess:
    """``nas argv`` in a fresh process (its own torch threads), printing each step's thread count; killed by ``sig`` at
    step (or visit) ``kill_at``."""
    command, *rest = argv
    script = WATCHED.format(root=str(ROOT), kill_at=kill_at, signal=int(sig), argv=[command, "-q", *rest])
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=600)


def threads_seen(done: subprocess.CompletedProcess) -> set[int]:
    return {int(line.split()[3]) for line in done.stdout.splitlines() if line.startswith("step ")}


@pytest.fixture(scope="module")
def resumables(tmp_path_factory):
    """Inputs of every resumable command: a small space (this module's), a subnet of it, a corpus, an exported LM, an
    exported encoder, labelled rows, an encoder-decoder space with its pairs, a supernet checkpoint that names its corpus
    and a predictor (for the hurdles)."""
    from search_spaces import load_space

    from tests.tasks.translation.translation_fakes import MINI_SEQ2SEQ, write_toy_tsv

    d = tmp_path_factory.mktemp("resumables")
    small = load_space(space_file(d, "small"))
    (d / "subnet.yaml").write_text(Subnet(64, 2, (2, 1), (64, 64), ("softmax", "softmax")).to_yaml())
    (d / "text").mkdir()  # (not "corpus": the supernet's folder below holds its corpus cache under that name)
    text = Path(json.__file__).read_text() + Path(csv.__file__).read_text()
    (d / "text" / "a.txt").write_text(text[: len(text) // 2])
    (d / "text" / "b.txt").write_text(text[len(text) // 2:])
    (d / "labels.csv").write_text("text,label\n" + "".join(f"{w} number {i},{'ab'[i % 2]}\n" for i, w in
                                                           zip(range(40), ["alpha", "beta", "gamma", "delta"] * 10)))
    (d / "mini.yaml").write_text(MINI_SEQ2SEQ.format(positions="rope"))
    write_toy_tsv(d / "toy.tsv")
    quick = ["--data", str(d / "text"), "--max-steps", "1", "--batch-size", "2", "--seq-len", "32", "--format", "torch",
             "--eval-batches", "1", "-q"]
    assert main(["train-subnet", str(d / "subnet.yaml"), "--space", str(d / "small.yaml"), "--out", str(d / "lm"), *quick]) == 0
    encoder = Subnet(64, 1, (1,), (128,), ("softmax",))
    (d / "enc.yaml").write_text(encoder.to_yaml())
    assert main(["train-subnet", str(d / "enc.yaml"), "--space", "encoder-tiny", "--out", str(d / "enc"), *quick]) == 0
    ckpt = save_checkpoint(d / "supernet.pt", SuperTransformer(small, generator=torch.Generator().manual_seed(0)),
                           {}, step=1, data=str(d / "text"), data_seed=0, val_fraction=0.5)
    (d / "val.txt").write_text(text[:20000])
    rng = np.random.default_rng(0)
    x, _ = subnet_matrix("additive", small, small.workload(), [small.sample(rng) for _ in range(20)])
    Predictor("additive", Additive().fit(x, 1 + x.sum(1) * 1e-9), small, small.workload(), {"device": "cpu"}).save(d / "pred")
    return {"dir": d, "ckpt": str(ckpt), "pred": str(d / "pred"), "subnet": str(d / "subnet.yaml"),
            "space": str(d / "small.yaml")}


FLAGS = ["--threads", "1", "--batch-size", "4", "--seq-len", "32", "--lr", "1e-3"]  # none of them the default
TRAIN = [*FLAGS, "--max-steps", "6", "--ckpt-interval", "2", "--eval-interval", "3", "--eval-batches", "1"]


def resumable_cases(r: dict) -> dict:
    """name -> (the first command with --out OUT, the command that resumes it, kill at step, what is compared)."""
    d = r["dir"]
    corpus = ["--data", str(d / "text")]
    search = ["search", r["ckpt"], "--predictor", r["pred"], "--budget", "2ms", "--val-data", str(d / "val.txt"),
              "--val-windows", "2", "--seq-len", "32", "--population", "4", "--parents", "2", "--mutations", "2",
              "--crossovers", "2", "--generations", "2", "--hurdles", "2", "--hurdle-candidates", "2", "--hurdle-batch-size", "4",
              "--hurdle-from", "inherited", "--hurdle-tokens", "768", "--device", "cpu", "--no-progress", "--out", "OUT"]
    measure = ["measure-latency", r["space"], "--device", "cpu", "--timing-threads", "1", "--samples", "8", "--retest",
               "0.25", "--seed", "3", "--timing-warmup", "1", "--repeats", "4", "--rounds", "2", "--min-sample-ms", "1", "--out",
               "OUT/t.csv"]
    return {
        "train-supernet": (["train-supernet", r["space"], *corpus, *TRAIN, "--out", "OUT"],
                           ["train-supernet", "--out", "OUT", "--resume"], 5, "final.pt"),
        "train-supernet seq2seq": (["train-supernet", str(d / "mini.yaml"), "--data", str(d / "toy.tsv"), "--threads", "1",
                                    "--batch-size", "4", "--lr", "1e-3", "--max-steps", "6", "--ckpt-interval", "2",
                                    "--eval-interval", "3", "--eval-batches", "1", "--out", "OUT"],
                                   ["train-supernet", "--out", "OUT", "--resume"], 5, "final.pt"),
        "train-subnet": (["train-subnet", r["subnet"], "--space", r["space"], *corpus, *TRAIN, "--format", "torch", "--out",
                          "OUT"],
                         ["train-subnet", "--out", "OUT", "--resume"], 5, "model.safetensors"),
        "finetune": (["finetune", "--model", str(d / "lm"), *corpus, *TRAIN, "--format", "torch", "--out", "OUT"],
                     ["finetune", "--model", str(d / "lm"), "--out", "OUT", "--resume"], 5, "model.safetensors"),
        "finetune classify": (["finetune", "--task", "classify", "--model", str(d / "enc"), "--data", str(d / "labels.csv"),
                               *TRAIN[:-2], "--out", "OUT"],  # (no --eval-batches: the whole validation split is scored)
                              ["finetune", "--task", "classify", "--model", str(d / "enc"), "--out", "OUT", "--resume"], 5,
                              "classifier.safetensors"),
        "hurdles": (search, search, 4, "hurdles"),
        "measure-latency": (measure, measure, 5, "t.csv"),
    }


def compared(out: Path, what: str):
    """What must be bit for bit the same in an uninterrupted and a resumed run's --out."""
    if what == "final.pt":
        payload = torch.load(out / what, weights_only=True)
        return payload["state"]["step"], {k: v.numpy().tobytes() for k, v in payload["model"].items()}
    if what == "hurdles":  # (the table names each model's folder, under this --out)
        weights = sorted((p.relative_to(out).parts[-3:], p.read_bytes()) for p in (out / "hurdles").rglob("model.safetensors"))
        table = (out / "hurdles.csv").read_text().replace(str(out), "OUT")
        return table, (out / "hurdles_2ms.yaml").read_text().replace(str(out), "OUT"), weights
    if what == "t.csv":  # every row (a resumed campaign appends the rest in its own order; the host's load average
        with open(out / what, newline="") as f:  # at the time is a note, not a result) and the baseline
            table = sorted(tuple(sorted((k, v) for k, v in r.items() if k != "load")) for r in csv.DictReader(f))
        return table, json.loads(Path(str(out / what) + ".json").read_text())["baseline_ms"]
    return (out / what).read_bytes()


@pytest.mark.parametrize("name", ["train-supernet", "train-supernet seq2seq", "train-subnet", "finetune", "finetune classify",
                                  "hurdles", "measure-latency"])
def test_kill_9_of_every_resumable_command_with_non_default_flags_resumes_bit_for_bit(resumables, tmp_path, name):
    """Uninterrupted, then killed (kill -9 between checkpoints) and resumed by the documented command: the same bits.
    Every step of the resumed run ran on the first run's threads (1, not torch's default), which no flag repeats."""
    first, again, kill_at, what = resumable_cases(resumables)[name]

    def at(argv, out):
        return [str(out) if a == "OUT" else f"{out}/t.csv" if a == "OUT/t.csv" else a for a in argv]

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    done = watched_run(at(first, whole))
    assert done.returncode == 0, done.stderr[-2000:]
    killed = watched_run(at(first, cut), kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = watched_run(at(again, cut))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    if name == "hurdles":  # (the search has no --threads: its trainings run on the process's, the same command's)
        assert len(threads_seen(done)) == 1 and threads_seen(done) == threads_seen(killed) == threads_seen(resumed)
    elif name != "measure-latency":  # (the fake device times on a clock of its own; its threads go in the fingerprint)
        assert threads_seen(done) == threads_seen(killed) == threads_seen(resumed) == {1}
    assert compared(cut, what) == compared(whole, what)


def test_the_ctrl_c_hint_is_a_command_that_resumes_exactly(resumables, tmp_path):
    """train-subnet with --threads 1 and other non-default flags, Ctrl-C at step 3: the command the hint gives (and no
    other flag) ends with the uninterrupted run's weights, on the first run's thread count."""
    import shlex

    first, _, _, what = resumable_cases(resumables)["train-subnet"]
    whole, cut = tmp_path / "whole", tmp_path / "with space"  # (a folder the hint must quote)
    assert watched_run([str(whole) if a == "OUT" else a for a in first]).returncode == 0
    stopped = watched_run([str(cut) if a == "OUT" else a for a in first], kill_at=3, sig=signal.SIGINT)
    assert stopped.returncode == 130, stopped.stderr[-2000:]
    hint = [line for line in stopped.stdout.splitlines() if "Continue with: " in line]
    assert len(hint) == 1 and hint[0].startswith("interrupted at step 3; saved "), stopped.stdout
    command = shlex.split(hint[0].split("Continue with: ", 1)[1])
    assert command == ["nas", "train-subnet", "--out", str(cut), "--resume"]
    resumed = watched_run(command[1:])
    assert resumed.returncode == 0 and threads_seen(resumed) == {1}, resumed.stderr[-2000:]
    assert compared(cut, what) == compared(whole, what)


def test_a_timing_table_refuses_a_rerun_with_other_flags_naming_them(tmp_path, capsys, monkeypatch):
    import latency.device

    monkeypatch.setattr(latency.device, "get_device", lambda name, **o: FakeDevice(threads=o.get("threads") or 0))
    out = tmp_path / "t.csv"
    argv = ["measure-latency", "-q", "tiny", "--device", "cpu", "--samples", "4", "--retest", "0.5",
            "--timing-warmup", "1",
            "--repeats", "2", "--rounds", "1", "--min-sample-ms", "1", "--out", str(out)]
    assert main(argv + ["--timing-threads", "1"]) == 0
    before = out.read_text()
    capsys.readouterr()
    cases = [
        ([], "it was measured on another device or runtime (mixing fingerprints in one file is refused; use another --out):"
             "\n  threads: file has 1, this run has 0"),
        (["--timing-threads", "1", "--samples", "3"], "its subnets is {'measure': 4, 'retest': 2}, this run's is {'measure': 3, "
                                               "'retest': 2}; a rerun may add subnets (more --samples or --retest), not "
                                               "drop them: give at least its counts, or another --out"),
        (["--timing-threads", "1", "--seed", "1"], "its seed is 0, this run's is 1; use the same flags or another --out"),
    ]
    for extra, expected in cases:
        assert main(argv + extra) == 2
        assert capsys.readouterr().err == f"nas measure-latency: error: {out}: cannot append: {expected}\n"
    assert out.read_text() == before
    assert main(argv + ["--timing-threads", "1"]) == 0 and "nothing left to measure" in capsys.readouterr().out


# --------------------------------------------------------------------------- translation: pairs, languages, decoding bounds


def test_a_tsv_line_of_more_than_two_fields_is_refused_not_trained_as_the_target(tmp_path, capsys):
    from tasks.translation.data import read_tsv

    from tests.tasks.translation.translation_fakes import MINI_SEQ2SEQ

    good = "".join(f"file {i}\tDatei {i}\n" for i in range(10))
    variants = {
        "scored.tsv": (good + "src\ttgt\tid7\t0.93\n", "line 11 has 4 tab-separated fields"),
        "three.tsv": ("a\tb\tc\n" + good, "line 1 has 3 tab-separated fields"),
        "many.tsv": (good.replace("\n", "\textra\n"), "line 1 (and 9 more lines) has 3 tab-separated fields"),
        "crlf.tsv": (good.replace("\n", "\r\n") + "x\ty\t\r\n", "line 11 has 3 tab-separated fields"),
    }
    for name, (text, expected) in variants.items():
        (tmp_path / name).write_bytes(text.encode())
        with pytest.raises(UserError) as e:
            read_tsv(tmp_path / name)
        assert str(e.value) == (f"--data {tmp_path / name}: {expected}; expected 2 (source<TAB>target): keep the first two "
                                "columns (cut -f1,2) or remove the tabs inside the texts")
    (tmp_path / "ok.tsv").write_text(good)
    assert read_tsv(tmp_path / "ok.tsv")[0] == (b"file 0", b"Datei 0")
    (tmp_path / "mini.yaml").write_text(MINI_SEQ2SEQ.format(positions="rope"))
    line = one_error(capsys, ["train-supernet", str(tmp_path / "mini.yaml"), "--data", str(tmp_path / "scored.tsv"),
                              "--max-steps", "1", "--out", str(tmp_path / "run")])
    assert line.startswith(f"nas train-supernet: error: --data {tmp_path / 'scored.tsv'}: line 11 has 4 tab-separated")
    assert not (tmp_path / "run" / "latest.pt").exists() and not (tmp_path / "run" / "translation").exists()


def test_a_language_is_a_name_checked_before_any_path_is_made_of_it(tmp_path, capsys, monkeypatch):
    import tasks.translation.data as tr

    from tests.tasks.translation.translation_fakes import MINI_SEQ2SEQ

    (tmp_path / "mini.yaml").write_text(MINI_SEQ2SEQ.format(positions="rope"))
    expected = "is not a language name; expected a gettext locale such as de, fr, pt_BR or sr@latin"
    for lang in ["", "../../etc", "..", "de/../fr", " de", "x", "d" * 100, "de\n"]:
        for argv in (["train-supernet", str(tmp_path / "mini.yaml"), "--max-steps", "1"],
                     ["train-subnet", "s.yaml", "--space", str(tmp_path / "mini.yaml")]):
            line = one_error(capsys, [*argv, f"--lang={lang}", "--out", str(tmp_path / "run")])
            assert line == f"nas {argv[0]}: error: --lang: {lang[:40]!r} {expected}", line
    assert not (tmp_path / "run").exists()
    looked = []
    monkeypatch.setattr(tr.Path, "glob", lambda self, pattern: looked.append(self) or iter(()))
    with pytest.raises(UserError, match=r"^--lang: '\.\./\.\./etc' is not a language name"):
        tr.catalogs("../../etc", tmp_path)
    assert looked == []  # refused before a path was made of it, let alone read
    for good in ("de", "pt_BR", "sr@latin", "zh_CN.UTF-8"):
        assert tr.check_lang(good) == good


def test_translate_refuses_a_beam_wider_than_the_vocabulary_and_more_bytes_than_the_model_decodes(translation_run, capsys):
    model = str(translation_run / "run")
    cases = [
        (["--beam", "10000"], "--beam: 10000 is more than the model's 259 tokens; a beam holds at most one hypothesis per "
                              "token at the first step (give at most 259; 4-8 is the usual width)"),
        (["--beam", "260"], "--beam: 260 is more than the model's 259 tokens"),
        (["--max-bytes", "100000"], "--max-bytes: 100000 is more than the model's max_seq_len of 40 bytes, the longest "
                                    "translation it decodes (give at most that)"),
        (["--max-bytes", "41", "--beam", "2"], "--max-bytes: 41 is more than the model's max_seq_len of 40 bytes"),
    ]
    for extra, expected in cases:
        line = one_error(capsys, ["translate", "--model", model, "file not found", *extra])
        assert line.startswith(f"nas translate: error: {expected}"), line
    assert main(["translate", "--model", model, "file not found", "--beam", "3", "--max-bytes", "40"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1

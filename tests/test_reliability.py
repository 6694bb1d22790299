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

from .conftest import ROOT
from .latency_fakes import FakeDevice
from .test_latency_table import SETTINGS
from .test_latency_table import campaign as latency_table_campaign

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
    export = ["export", "--supernet", ckpt, "--subnet", subnet, "--no-eval", "--format", "torch"]
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
        (export[:4] + [str(tmp_path / "dup.yaml"), "--out", str(tmp_path / "e")],
         "nas export: error: dup.yaml: duplicate key 'embed_dim' at line 5 (first at line 1): a key may appear once in a "
         "mapping"),
        (["export", "--supernet", str(d / "empty.pt"), "--subnet", subnet, "--out", str(tmp_path / "e")],
         f"nas export: error: {d / 'empty.pt'}: not a readable supernet checkpoint (the file is empty: 0 bytes, a copy or a "
         "save that did not finish)"),
        (["export", "--supernet", str(d / "evil.pt"), "--subnet", subnet, "--out", str(tmp_path / "e")],
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
        (["search", ckpt, "--predictor", files["pred"], "--budget", "1ms", "--verify", "bogus", "--out", str(tmp_path / "s")],
         "nas search: error: --verify: 'bogus' is not a device (available: cpu, cuda, onnxruntime, arm --bundle FILE, "
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
    base = ["export", "--supernet", files["ckpt"], "--subnet", files["subnet"], "--no-eval", "--out", str(out)]
    assert main(base + ["--format", "torch,onnx"]) == 0
    assert (out / "model.onnx").exists()
    other = tmp_path / "s2.yaml"
    other.write_text(Subnet(96, 1, (2,), (256,), ("softmax",)).to_yaml())
    base[4] = str(other)
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


KILLED_CAMPAIGN = """
import sys, time
sys.path.insert(0, {root!r})
from search_spaces import load_space
from tests.latency_fakes import FakeDevice
from tests.test_reliability import campaign
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
    line = one_error(capsys, ["export", "-q", "--supernet", files["ckpt"], "--subnet", files["subnet"], "--no-eval",
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
    subprocess.run(["mount", "-o", "remount,ro", str(full_disk)], check=True)
    assert one_error(capsys, ["fit-predictor", str(table), "--out", str(full_disk / "p2")]) == (
        f"nas fit-predictor: error: --out: {full_disk / 'p2'}: {full_disk} is not writable (read-only or no permission); "
        "write elsewhere")
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
    argv = ["export", "-q", "--supernet", files["ckpt"], "--subnet", files["subnet"], "--no-eval", "--format", "torch,onnx"]
    assert main(argv + ["--out", str(whole)]) == 0
    other = tmp_path / "s2.yaml"
    other.write_text(Subnet(96, 2, (2, 1), (256, 128), ("softmax", "linear")).to_yaml())
    assert main(argv[:5] + [str(other), *argv[6:], "--out", str(out)]) == 0  # an earlier export of another subnet there
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
        assert model.subnet == SUBNET
    assert main(argv + ["--out", str(out)]) == 0
    assert load_model(out).subnet == SUBNET
    card, expected = (json.loads((d / "model_card.json").read_text())["files"] for d in (out, whole))
    assert sorted(card) == sorted(expected) and all(card[n] == expected[n] for n in ("model.safetensors", "model.onnx"))
    assert all(torch.equal(a, b) for a, b in zip(load_file(out / "model.safetensors").values(),
                                                 load_file(whole / "model.safetensors").values()))

"""A fuzz test of `nas report` (issue 55): run folders built at random from the toolkit's own (a demo, a search, an
export, a predictor, a training run, a folder of results), then broken at random: JSON of random types, sizes and
nesting in place of a document or one of its fields, links (out of the folder, to /proc/self/environ, dangling, in
a loop), FIFOs, huge sparse files, garbage bytes, huge CSV cells, names that are not UTF-8 or hold markup or a
newline.  Every case must end in a page (exit 0, valid UTF-8, nothing from outside the folder, no markup of the
run's) or in one line with exit status 2 and no page, never in a traceback or a hang.

The cases run in one child process (`python tests/nas/test_report_fuzz.py DIR SEED SECONDS`) under a memory limit, each
under two timers (CPU time for a case that computes too long, wall time for one blocked, as by a FIFO's open());
the parent reads one JSON line per case.  The seed fixes the cases; the CPU budget how many of them run (each
prints what was done to its folder, so a failure can be rebuilt)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEED = 55
BUDGET_S = 20.0  # CPU seconds of cases in the child, after its start-up (about as many wall seconds on a quiet machine)
WALL_S = 240.0  # no case starts this many wall seconds after the child started (a busy machine runs fewer cases)
CASE_CPU_S = 10  # one case: a page takes well under a second or two of CPU; more is a failure
CASE_WALL_S = 90  # ... and a case blocked without using the CPU (a FIFO opened) ends here
MIN_CASES = 8  # when the CPU budget ended the run (on a busy machine, when the wall clock did: 3)
MEMORY = 2.5 * 2**30  # address space of the child: a file read whole fails fast instead of swapping
SECRET = "SECRET-c4d9e1"


def test_fuzz_every_case_ends_in_a_page_or_one_line(tmp_path):
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (int(MEMORY), int(MEMORY)))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    try:
        done = subprocess.run([sys.executable, __file__, str(tmp_path), str(SEED), str(BUDGET_S)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=WALL_S + CASE_WALL_S + 60, preexec_fn=limit)
        stdout, code, stderr = done.stdout, done.returncode, done.stderr
    except subprocess.TimeoutExpired as e:  # what it printed until then (bytes, whatever text= says)
        out = e.stdout or b""
        stdout, code, stderr = out.decode(errors="replace") if isinstance(out, bytes) else out, "timeout", ""
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    started = {r["case"]: r["what"] for r in lines if "started" in r}
    results = [r for r in lines if "outcome" in r]
    unfinished = sorted(set(started) - {r["case"] for r in results})
    assert code == 0 and not unfinished, (f"the fuzzing process ended with {code} during case(s) {unfinished}: "
                                          f"{[started[c] for c in unfinished]}\n{stderr[-3000:]}")
    bad = [r for r in results if r["outcome"] not in ("page", "refused")]
    assert not bad, "\n\n".join(f"case {r['case']} (seed {SEED}): {r['what']}\n{r['outcome']}: {r['detail']}" for r in bad)
    (end,) = [r["ended"] for r in lines if "ended" in r]
    assert len(results) >= (MIN_CASES if end == "budget" else 3), f"only {len(results)} cases ({end})"
    outcomes = {r["outcome"] for r in results}
    assert "page" in outcomes  # the cases reach the page, not only the refusals


# --------------------------------------------------------------------------- the child: building and running cases


class CaseTimeout(BaseException):
    """A case ran past its timer (a BaseException: no `except Exception` in the code under test swallows it)."""


MARKUP = ["<form action=https://evil.example><input name=pw></form>", '<meta http-equiv="refresh" content="0;url=x">',
          "<script>alert(1)</script>", "</table><img src=x onerror=alert(1)>", "\"'><svg onload=alert(1)>"]


def random_text(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.3:
        return rng.choice(MARKUP)
    if pick < 0.4:
        return "x" * rng.choice([0, 1, 300, 5_000, 200_000])
    if pick < 0.5:
        return "".join(rng.choice(["\ud800", "\udcff", "\x00", "\n", "é", "\u202e", "\ufeff"]) for _ in range(8))
    return rng.choice(["6ms", "load", "found", "softmax", "", "nan", "1e999", "-0", "?"])


def random_value(rng: random.Random, depth: int = 0):
    """A JSON value of a random type, size and (bounded) nesting."""
    kind = rng.choice(["int", "float", "text", "bool", "null", "list", "dict"] if depth < 6 else ["int", "text", "null"])
    if kind == "int":
        return rng.choice([0, -1, 7, 2**53 + 1, -(10**300), 10**4000])
    if kind == "float":
        return rng.choice([0.5, -3.25, 1e308, float("nan"), float("inf"), -float("inf"), 1e-320])
    if kind == "text":
        return random_text(rng)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    n = rng.choice([0, 1, 3, 300]) if depth < 2 else rng.choice([0, 1, 2])
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(n)]
    return {random_text(rng)[:50] or "k": random_value(rng, depth + 1) for _ in range(n)}


def dumps(value) -> str:
    return json.dumps(value)  # NaN and Infinity as Python writes them (not strict JSON: the reader must cope)


def mutate(rng: random.Random, doc):
    """``doc`` with one to three fields (at any depth) replaced by random values or removed."""
    for _ in range(rng.randint(1, 3)):
        node, key = doc, None
        path = []
        while isinstance(node, (dict, list)) and node and rng.random() < 0.75:
            key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
            path.append((node, key))
            node = node[key]
        if not path:
            return random_value(rng)
        parent, key = path[-1]
        if isinstance(parent, dict) and rng.random() < 0.2:
            del parent[key]
        else:
            parent[key] = random_value(rng)
    return doc


def hazard(rng: random.Random, path: Path, outside: Path) -> str:
    """Break the file (or folder) ``path`` in one random way; what was done, in words."""
    import shutil

    def clear():
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()  # a FIFO

    kind = rng.choice(["json-field", "json-field", "json-value", "link", "fifo", "sparse", "garbage", "deep", "digits",
                       "empty", "csv-cell", "dir"])
    if (kind == "json-field" and path.suffix == ".json" and path.is_file() and not path.is_symlink()
            and path.stat().st_size < 2**20):  # not a huge file an earlier hazard made
        try:
            doc = json.loads(path.read_text())
        except ValueError:
            doc = {}
        path.write_text(dumps(mutate(rng, doc)))
        return f"{path.name}: fields mutated"
    clear()
    if kind in ("json-field", "json-value"):
        path.write_text(dumps(random_value(rng)))
    elif kind == "link":
        target = rng.choice([outside / "secret.txt", outside / "secret.png", outside, Path("/proc/self/environ"),
                             path.parent / "missing", path])
        path.symlink_to(target)
        kind = f"link to {target}"
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "sparse":
        with open(path, "wb") as f:
            f.write(b'{"a": "' if path.suffix == ".json" else b"head,\n")
            f.truncate(rng.choice([50 * 2**20, 3 * 2**30, 7 * 2**30]))
    elif kind == "garbage":
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.choice([1, 100, 5000]))))
    elif kind == "deep":
        n = rng.choice([65, 2_000, 100_000])
        path.write_text("[" * n + "]" * n if rng.random() < 0.5 else '{"a":' * n + "1" + "}" * n)
    elif kind == "digits":
        path.write_text("1" * rng.choice([4_301, 50_000]))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "csv-cell":
        path.write_text("name,value\n" + "a," + "x" * rng.choice([140_000, 300_000]) + "\n" + ",".join(["c"] * 5000) + "\n")
    elif kind == "dir":
        path.mkdir()
        (path / "inside.json").write_text("{}")
    return f"{path.name}: {kind}"


NAMES = [b"notes.txt", b"r\xe9sultats.csv", b"<img src=x onerror=alert(1)>.json", b"two\nlines.md", b"-rf.log",
         b"x" * 250 + b".txt", b".hidden.json", b"figure.png", b"page.html", b"\xff\xfe.md", b"a b.svg"]


def build_case(rng: random.Random, folder: Path, outside: Path) -> list[str]:
    """A run folder of a random kind, broken in one to four random ways; what was done, in words."""
    import tests.nas.report_fakes as fakes

    kind = rng.choice(["demo", "demo", "demo", "search", "model", "predictor", "training", "files"])
    if kind == "demo":
        fakes.demo_folder(folder)
    elif kind == "search":
        fakes.search_folder(folder)
    elif kind == "model":
        fakes.write_json(folder / "model_card.json", fakes.card())
    elif kind == "predictor":
        fakes.predictor_folder(folder)
    elif kind == "training":
        folder.mkdir(parents=True)
        (folder / "log.jsonl").write_text("\n".join(fakes.log_lines()) + "\n")
    else:
        folder.mkdir(parents=True)
        (folder / "README.md").write_text("# Results\n\n![fig](figure.png) [data](data.json) <b>x</b>\n\n| a | b |\n|--|--|\n"
                                          "| 1 | 2 |\n")
        (folder / "figure.png").write_bytes(fakes.png(3, 3))
        fakes.write_json(folder / "data.json", {"rows": [{"a": 1, "b": "x"}]})
        (folder / "table.csv").write_text("a,b\n1,2\n")
    done = [kind]
    files = sorted(p for p in folder.rglob("*") if p.name != "report.html")
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.25:
            name = os.fsdecode(rng.choice(NAMES))
            target = folder / name
            if not target.exists() and not target.is_symlink():
                target.write_text(rng.choice(MARKUP))
                done.append(hazard(rng, target, outside) if rng.random() < 0.5 else f"{name!r}: added")
            continue
        target = rng.choice(files)
        if target.exists() or target.is_symlink():
            done.append(hazard(rng, target, outside))
    return done


def run_case(main, folder: Path, page: Path) -> tuple[str, str]:
    """``nas report folder --out page`` in this process, under a timer: (outcome, detail)."""
    import contextlib
    import io
    import signal
    import traceback

    out, err = io.StringIO(), io.StringIO()
    signal.setitimer(signal.ITIMER_PROF, CASE_CPU_S)  # CPU time: a busy machine does not make a case fail
    signal.setitimer(signal.ITIMER_REAL, CASE_WALL_S)  # wall time: a blocked open() uses no CPU
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["report", str(folder), "--out", str(page)])
    except CaseTimeout:
        return "timeout", traceback.format_exc()[-3000:]
    except BaseException:  # noqa: BLE001 - a traceback is what the fuzz test looks for
        return "traceback", traceback.format_exc()[-3000:]
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
    lines = err.getvalue().splitlines()
    if code == 2 and len(lines) == 1 and lines[0].startswith("nas report: error: ") and not page.exists():
        return "refused", lines[0][:500]
    if code != 0 or lines or not page.exists():
        return "bad exit", f"exit {code}, stderr {err.getvalue()[-2000:]!r}, page written: {page.exists()}"
    try:
        text = page.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        return "bad page", f"not UTF-8: {e}"
    environ = Path("/proc/self/environ").read_bytes().split(b"\0")[:3]  # entries of this process's environment
    leaks = [SECRET, *(e.decode(errors="replace") for e in environ if len(e) > 8), "<form", "<input", "<script",
             "<img src=x", "<svg", '<meta http-equiv="refresh']
    for leak in leaks:
        if leak in text:
            return "bad page", f"{leak!r} is in the page"
    return "page", f"{len(text):,} characters"


def child(root: Path, seed: int, budget: float) -> None:
    import signal
    import time

    start = time.monotonic()

    def alarm(signum, frame):
        raise CaseTimeout(f"over {CASE_CPU_S} s of CPU" if signum == signal.SIGPROF else f"blocked {CASE_WALL_S} s")

    signal.signal(signal.SIGALRM, alarm)
    signal.signal(signal.SIGPROF, alarm)
    import matplotlib.pyplot as plt

    import nas.report  # noqa: F401 - everything the report imports, loaded before any timer runs (an import cut
    import nas.search.pareto  # noqa: F401 - short by the timer would leave a module half made for the next case)
    import supernet.files  # noqa: F401
    from nas.cli import main
    from tests.nas.report_fakes import png

    plt.close(plt.figure())

    outside = root / "outside"
    outside.mkdir(parents=True)
    (outside / "secret.txt").write_text(SECRET)
    (outside / "secret.png").write_bytes(png(2, 2) + SECRET.encode())
    cpu, case = time.process_time(), 0
    while (ended := "budget" if time.process_time() - cpu >= budget else "wall clock" if time.monotonic() - start >= WALL_S
           else None) is None:
        rng = random.Random(seed * 1_000_003 + case)
        what = build_case(rng, root / f"case{case}", outside)
        print(json.dumps({"case": case, "started": True, "what": what}), flush=True)
        outcome, detail = run_case(main, root / f"case{case}", root / f"case{case}.html")
        print(json.dumps({"case": case, "outcome": outcome, "detail": detail, "what": what}), flush=True)
        case += 1
    print(json.dumps({"ended": ended}), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    child(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))

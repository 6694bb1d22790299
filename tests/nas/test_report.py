"""`nas report` and the figures it shows: what each figure says is read back from its matplotlib objects, the page
is checked for escaping and self-containment, and rendered in a real browser (headless Chromium, where installed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH: install Debian's `chromium` (as .ci/run does) to render the page"
)


def render(page: Path, work: Path) -> tuple[np.ndarray, str, list[str]]:
    """Open ``page`` in headless Chromium: (the screenshot's pixels, the DOM it built, its console messages)."""
    import matplotlib.image

    work.mkdir(parents=True, exist_ok=True)
    base = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={work / 'profile'}",
            "--enable-logging=stderr", "--v=0", "--window-size=1280,1600"]
    shot = work / "shot.png"
    a = subprocess.run([*base, f"--screenshot={shot}", page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    b = subprocess.run([*base, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-2000:] + b.stderr[-2000:]
    console = [line for line in (a.stderr + b.stderr).splitlines() if ":CONSOLE" in line]
    return matplotlib.image.imread(shot), b.stdout, console


def assert_renders(page: Path, work: Path, headings: list[str]) -> None:
    pixels, dom, console = render(page, work)
    assert console == []  # no errors, no refused loads (the page's policy forbids every fetch and says so here)
    gray = pixels[..., :3].mean(axis=2)
    assert gray.std() > 0.02 and (gray < 0.5).mean() > 0.001  # not blank: text (and figures) drawn
    for h in headings:
        assert f"<h2>{h}</h2>" in dom


class Figures:
    """Every figure saved through ``module.atomic_savefig``, kept open for reading back."""

    def __init__(self, monkeypatch, module):
        self.saved: list = []
        real = module.atomic_savefig

        def keep(fig, path, **kw):
            fig.canvas.draw()
            self.saved.append((Path(path).name, fig))
            return real(fig, path, **kw)

        monkeypatch.setattr(module, "atomic_savefig", keep)
        import matplotlib.pyplot as plt

        monkeypatch.setattr(plt, "close", lambda fig=None: None)  # keep them readable


def visible_tick_labels(ax, axis: str):
    axis_obj = ax.xaxis if axis == "x" else ax.yaxis
    lo, hi = ax.get_xlim() if axis == "x" else ax.get_ylim()
    ticks = [*axis_obj.get_major_ticks(), *axis_obj.get_minor_ticks()]
    return [t.label1 for t in ticks if t.label1.get_visible() and t.label1.get_text() and lo <= t.get_loc() <= hi]


@pytest.mark.parametrize("lo_ms,hi_ms", [(0.6, 40.0), (1.5, 2.6), (8.0, 130.0)])
def test_predicted_vs_measured_tick_labels_do_not_overlap(tmp_path, monkeypatch, lo_ms, hi_ms):
    import latency.report as R

    figs = Figures(monkeypatch, R)
    rng = np.random.default_rng(0)
    measured = np.geomspace(lo_ms, hi_ms, 12)
    R.plot(tmp_path / "p.png", measured, measured * rng.uniform(0.93, 1.07, 12), "additive on t.csv",
           retest=(measured, measured * 1.01))
    ((_, fig),) = figs.saved
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    for axis in "xy":
        labels = visible_tick_labels(ax, axis)
        assert 2 <= len(labels) <= 6, [t.get_text() for t in labels]
        boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0 if axis == "x" else b.y0)
        for a, b in zip(boxes, boxes[1:]):
            assert not a.overlaps(b), (axis, [t.get_text() for t in labels])


def test_log_ticks_are_round_inside_and_refuse_a_bad_range():
    from latency.report import log_ticks

    for lo, hi in [(0.9, 11.0), (0.55, 1.9), (3.0, 400.0), (17.0, 23.0)]:
        ticks = log_ticks(lo, hi)
        assert 1 <= len(ticks) <= 6 and ticks == sorted(set(ticks)) and all(lo <= t <= hi for t in ticks)
        mantissas = {round(t / 10 ** np.floor(np.log10(t)), 6) for t in ticks}
        assert mantissas <= {1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0} or hi / lo < 1.6, ticks
        assert all(float(f"{t:.2g}") == t for t in ticks)
    with pytest.raises(ValueError, match="lo=2.0, hi=1.0"):
        log_ticks(2.0, 1.0)


@pytest.fixture(scope="module")
def search_dir(tmp_path_factory):
    """A real `nas search --margin 20 --verify` folder (tiny supernet, a predictor in a folder named `predictor`, a fake
    device 3% faster than predicted), with every figure its writers saved kept open."""
    import latency.device
    import nas.search.pareto as P
    from nas.cli import main
    from search_spaces import load_space
    from supernet import SuperTransformer
    from supernet.checkpoint import save_checkpoint
    from tests.latency.latency_fakes import FakeDevice
    from tests.nas.test_export import fake_predictor

    tmp = tmp_path_factory.mktemp("search")
    mp = pytest.MonkeyPatch()
    figs = Figures(mp, P)

    class Device(FakeDevice):
        def prepare(self, model, workload):
            run = super().prepare(model, workload)
            return lambda n: 0.97 * run(n)

    mp.setattr(latency.device, "get_device", lambda name, **kw: Device())
    # every visit above the core count, whatever this machine's load: each timing carries the load flag, which the page
    # must explain wherever it shows one (a quiet machine flagged none, a busy one all)
    mp.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    tiny = load_space("tiny")
    ckpt = save_checkpoint(tmp / "supernet.pt", SuperTransformer(tiny, generator=torch.Generator().manual_seed(0)).eval())
    (tmp / "val.txt").write_bytes(b"def f(x):\n    return x * 2\n" * 40)
    pred = fake_predictor(tiny, tmp / "predictor")
    args = ["search", str(ckpt), "--predictor", str(pred), "--val-data", str(tmp / "val.txt"), "--val-windows", "3",
            "--seq-len", "32", "--population", "6", "--parents", "2", "--mutations", "3", "--crossovers", "3",
            "--generations", "2", "--out", str(tmp / "out"), "--no-progress", "--budget", "6ms", "--margin", "20",
            "--verify", "fake", "--verify-top", "3", "-q"]
    try:
        code = main(args)
    finally:
        mp.undo()
    assert code == 0
    return tmp / "out", figs.saved


def test_pareto_figure_says_what_it_draws(search_dir):
    out, saved = search_dir
    assert [name for name, _ in saved] == ["pareto.png", "pareto.png"]  # after the search, then with the device's times
    search = json.loads((out / "search.json").read_text())
    best = search["budgets"]["6ms"]["best"]
    checks = json.loads((out / "verify.json").read_text())["budgets"]["6ms"]["checks"]
    ax = saved[-1][1].axes[0]
    title = ax.get_title()
    assert "predictor predictor" not in title and "additive predictor from predictor/" in title
    assert ax.get_ylabel().replace("\n", " ") == "bits/byte on 3 held-out windows x 32 tokens (inherited weights)"
    # the budget (dashed) and the search's own limit 20% below it (dotted)
    vertical = {(round(line.get_xdata()[0], 6), line.get_linestyle()) for line in ax.lines if len(set(line.get_xdata())) == 1
                and line.get_transform() is not ax.transData}
    assert (6.0, "--") in vertical and (4.8, ":") in vertical
    # the star's label is its own latency, not the budget's
    (note,) = [t.get_text() for t in ax.texts]
    assert note == f"best under 6ms: {best['latency_ms']:.3f} ms predicted"
    # the device's measurements, at the measured latency
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "measured on fake, holds (3)" in legend and "search limit (budget less the margin)" in legend
    diamonds = [c for c in ax.collections if c.get_label().startswith("measured on")]
    xs = sorted(float(x) for c in diamonds for x in c.get_offsets()[:, 0])
    assert xs == pytest.approx(sorted(c["measured_ms"] for c in checks))
    # the figure before the verification has no measured points
    first = saved[0][1].axes[0]
    assert not [c for c in first.collections if c.get_label().startswith("measured on")]
    # the found model's star: in the legend, and drawn over everything else (the diamonds, the front)
    (star,) = [c for c in ax.collections if c.get_label() == "best per budget (the found model)"]
    assert "best per budget (the found model)" in legend
    assert star.get_offsets()[0].tolist() == pytest.approx([best["latency_ms"], best["loss_bpb"]])
    others = [a for a in [*ax.collections, *ax.lines] if a is not star]
    assert star.get_zorder() > max(a.get_zorder() for a in others)


def test_report_of_a_search_folder(search_dir, tmp_path, capsys):
    from nas.cli import main

    out, _ = search_dir
    assert main(["report", str(out), "--out", str(tmp_path / "r.html")]) == 0
    assert "search folder" in capsys.readouterr().out
    page = (tmp_path / "r.html").read_text()
    # pareto.png inline, and the search's best per generation (drawn from pareto.csv: the search ran 2 generations)
    assert page.count('src="data:image/png;base64,') == 2
    assert 'alt="pareto.png"' in page and "<h3>Best per generation</h3>" in page
    assert "<h2>Verification on the device</h2>" in page and "6ms: holds" in page
    assert "loss: bits/byte on 3 held-out windows x 32 tokens (inherited weights)" in page
    assert "http://" not in page and "https://" not in page and "<script" not in page
    if CHROMIUM:
        assert_renders(tmp_path / "r.html", tmp_path / "chromium", ["Search", "Verification on the device"])


def test_report_of_the_claim_benchmark_folder(tmp_path, capsys):
    from nas.cli import main

    claim = ROOT / "docs" / "benchmarks" / "claim"
    assert main(["report", str(claim), "--out", str(tmp_path / "claim.html")]) == 0
    page = (tmp_path / "claim.html").read_text()
    for name in ("README.md", "claim.png", "ranker.png", "stability.png", "claim.csv", "claim.json", "seeds.json"):
        assert f"<h2>{name}</h2>" in page
    assert page.count('src="data:image/png;base64,') == len(list(claim.glob("*.png"))) == 3
    assert "<h3>Does the search pay off?" in page  # the Markdown's heading, under the file's own
    assert '<a href="#claim-json">' in page  # a link to a file of the folder goes to its section
    assert not (claim / "report.html").exists()


def test_untrusted_file_contents_are_escaped_and_nothing_loads_from_the_network(tmp_path):
    from nas.report import write_report

    d = tmp_path / "bench"
    d.mkdir()
    (d / "README.md").write_text(
        "# Title <script>alert(1)</script>\n\n| a | b |\n|---|---|\n| <b>x</b> | [go](javascript:alert(2)) |\n\n"
        "![remote](http://example.com/x.png) and [the web](https://example.com/) and `<i>code</i>`\n"
    )
    (d / "rows.csv").write_text('name,value\n"<img src=x onerror=alert(3)>",0.12345678901234\n')
    (d / "doc.json").write_text(json.dumps({"</table><script>alert(4)</script>": "x\n<style>body{display:none}</style>"}))
    page = write_report(d).read_text()
    assert "<script" not in page and "<img src=x" not in page and "javascript:" not in page and "<style>body" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;img src=x onerror=alert(3)&gt;" in page
    assert '<a href="https://example.com/">the web</a>' in page  # a web link is kept (followed only when clicked)
    assert "example.com/x.png" not in page and "remote" in page  # a remote image is not fetched: its alt text stays
    assert ">0.123457<" in page  # a CSV's long float shown to 6 significant digits
    if CHROMIUM:
        assert_renders(d / "report.html", tmp_path / "chromium", ["README.md", "rows.csv", "doc.json"])


@needs_chromium
def test_the_browser_check_sees_a_fetch_and_a_blank_page(tmp_path):
    """The render check can fail: a page that loads from the network shows on the console, an empty page is blank."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!doctype html><meta http-equiv="Content-Security-Policy" content="default-src \'none\'">'
                   '<img src="http://example.com/x.png">')
    pixels, _, console = render(bad, tmp_path / "chromium")
    assert console and "example.com" in console[0]
    assert pixels[..., :3].mean(axis=2).std() < 0.01


def test_a_folder_with_nothing_to_show_is_refused_in_one_line(tmp_path, capsys):
    from nas.cli import main

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "latest.pt").write_bytes(b"\0")
    assert main(["report", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"nas report: error: {tmp_path / 'run'}: not a run folder: no summary.json") and "\n" not in err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "run")]) == 2  # --out is a file, not a folder
    assert "expected a file (the page)" in capsys.readouterr().err
    assert not (tmp_path / "run" / "report.html").exists()


@pytest.mark.skipif(not os.environ.get("NAS_REPORT_PAGE"), reason="NAS_REPORT_PAGE not set: .ci/run sets it to the page of "
                    "the `nas demo --quick` it runs")
@needs_chromium
def test_the_page_of_a_demo_run_renders(tmp_path):
    """.ci/run: the page `nas demo --quick` wrote renders in the browser, every section there, the console empty."""
    page = Path(os.environ["NAS_REPORT_PAGE"])
    assert_renders(page, tmp_path / "chromium", ["Result", "Search: the Pareto front", "Verification on the device",
                                                 "Latency predictor", "Comparison with the uniform baselines (comparison.csv)",
                                                 "Model card"])


# --------------------------------------------------------------------------- a demo run's page (issue 53)


def comparison_width(page: Path, work: Path) -> tuple[int, int]:
    """(the comparison table's width, the width of the column it sits in) as Chromium lays the page out in a 1,280-px
    window (a wider table scrolls sideways): a copy of the page with a script that writes them into the title (the
    page itself runs no script)."""
    import re

    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page.read_text())
    probe = ("<script>const t = document.querySelector('#comparison table'); document.title = "
             "t.getBoundingClientRect().width + ' ' + t.parentElement.clientWidth;</script></body>")
    copy = work / "probe.html"
    work.mkdir(parents=True, exist_ok=True)
    copy.write_text(text.replace("</body>", probe))
    done = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={work / 'profile'}", "--window-size=1280,1600", "--dump-dom",
                           copy.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    table, body = re.search(r"<title>([0-9.]+) ([0-9.]+)</title>", done.stdout).groups()
    return round(float(table)), round(float(body))


@pytest.fixture(scope="module")
def demo_page(search_dir, tmp_path_factory):
    """A demo run around the real search folder, its page, and every figure the report drew for it (kept open)."""
    import matplotlib.pyplot as plt

    import nas.report_figures as F
    import nas.search.pareto as P
    from nas.report import write_report
    from tests.nas.report_fakes import demo_folder

    out, _ = search_dir
    run = demo_folder(tmp_path_factory.mktemp("demo") / "run", search=out, predictor=out.parent / "predictor")
    drawn = {}
    mp = pytest.MonkeyPatch()
    for module, name in ((P, "pareto_figure"), (F, "learning_curve"), (F, "generations_figure")):
        def keep(*a, _real=getattr(module, name), _name=name, **kw):
            drawn[_name] = fig = _real(*a, **kw)
            return fig
        mp.setattr(module, name, keep)
    mp.setattr(plt, "close", lambda fig=None: None)
    try:
        page = write_report(run)
    finally:
        mp.undo()
    return run, page, drawn


def test_the_demo_page_counts_identical_baselines_once_and_plots_them(demo_page):
    run, page, drawn = demo_page
    text = page.read_text()
    summary = json.loads((run / "summary.json").read_text())
    # the verdict: "uniform softmax" and "uniform gqa:2" are one model (same parameters, same bits/byte): counted once
    assert ("lower bits/byte than all 2 uniform baselines at equal or lower measured latency</span> (3 names: uniform "
            "softmax and uniform gqa:2 are the same model, the same parameters and bits/byte, counted once)") in text
    assert "<li>uniform softmax = uniform gqa:2: 7.9123 bits/byte at 2.610 ms / 2.640 ms: +0.2111 bits/byte" in text
    # the Pareto figure of the page: the front, the uniform baselines (at their predicted latency, on the search's
    # windows: the front's axes), the found model's star on top of everything and in the legend
    ax = drawn["pareto_figure"].axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "uniform baselines (3)" in legend and "best per budget (the found model)" in legend
    (squares,) = [c for c in ax.collections if c.get_label() == "uniform baselines (3)"]
    distinct = [summary["baselines"][0], summary["baselines"][2], summary["baselines"][3]]
    np.testing.assert_allclose(squares.get_offsets(), [[b["predicted_ms"], b["search_bpb"]] for b in distinct])
    assert [t.get_text() for t in ax.texts if t.get_text() != ax.texts[-1].get_text()] == ["softmax = gqa:2", "linear",
                                                                                           "local:32"]
    (star,) = [c for c in ax.collections if c.get_label() == "best per budget (the found model)"]
    assert star.get_zorder() > max(a.get_zorder() for a in [*ax.collections, *ax.lines] if a is not star)
    assert text.count('alt="the search&#39;s Pareto front with the uniform baselines"') == 1
    assert 'alt="pareto.png"' not in text  # the stored figure, without the baselines, is replaced by this one


def test_the_demo_page_s_comparison_is_readable_and_fits_a_1280_px_screen(demo_page, tmp_path):
    import re

    run, page, _ = demo_page
    text = page.read_text()
    comparison = text[text.index('<section id="comparison">'):]
    comparison = comparison[:comparison.index("</section>")]
    heads = re.findall(r"<th>(.*?)</th>", comparison)
    assert heads == ["model", "parameters", "bits/byte (16 fresh windows)", "bits/byte (the search&#39;s 3 windows)",
                     "vs found: Δ bits/byte (paired SE)", "predicted ms", "measured ms (IQR)", "flags", "subnet"]
    rows = re.findall(r"<tr><td>(.*?)</td>", comparison)
    assert rows == ["found", "uniform softmax = uniform gqa:2", "uniform linear", "uniform local:32"]
    assert "<td class=\"num\">2.610 / 2.640 (0.021)</td>" in comparison  # both timings of the one model
    # the load flag, explained wherever timings show it
    for title in ("Verification on the device", "Comparison with the uniform baselines (comparison.csv)", "Model card"):
        part = text[text.index(f"<h2>{title}</h2>"):]
        assert "flags: <b>load</b>: the machine&#39;s 1-minute load average was above its core count" in \
            part[:part.index("</section>")]
    if CHROMIUM:
        assert_renders(page, tmp_path / "chromium", ["Result", "Search: the Pareto front", "Verification on the device",
                                                     "Latency predictor", "Comparison with the uniform baselines "
                                                     "(comparison.csv)", "Model card", "Reproduce"])
        width, column = comparison_width(page, tmp_path / "probe")
        assert width <= column < 1280, (width, column)  # before: 1,394 px in a column of 1,180


def test_the_demo_page_draws_the_learning_curve_and_the_best_per_generation(demo_page, search_dir):
    from tests.nas.report_fakes import log_lines

    run, page, drawn = demo_page
    text = page.read_text()
    assert "<h2>Training the supernet: the learning curve (supernet/log.jsonl)</h2>" in text
    train, held_out = drawn["learning_curve"].axes
    events = [json.loads(line) for line in log_lines()]
    lines = {line.get_label(): line for line in train.lines}
    assert sorted(lines) == ["largest", "smallest"]
    steps = [e["step"] for e in events if e["event"] == "train"]
    assert lines["largest"].get_xdata().tolist() == steps
    assert lines["largest"].get_ydata().tolist() == pytest.approx([e["loss"]["largest"] for e in events
                                                                   if e["event"] == "train"])
    assert held_out.get_ylabel() == "held-out bits/byte (lower is better)"
    assert {line.get_label(): line.get_ydata().tolist()[-1] for line in held_out.lines} == pytest.approx(
        {"largest": 6.0, "smallest": 7.3 - 100 / 120})
    # the search's best per generation: its last best so far is the search's best
    out, _ = search_dir
    best = json.loads((out / "search.json").read_text())["budgets"]["6ms"]["best"]["loss_bpb"]
    ax = drawn["generations_figure"].axes[0]
    (so_far,) = [line for line in ax.lines if line.get_label() == "6ms: best so far"]
    assert so_far.get_xdata().tolist() == [0, 1] and so_far.get_ydata()[-1] == pytest.approx(best, abs=1e-6)
    assert "<h3>Best per generation</h3>" in text


def test_the_reproduce_section_gives_commands_that_parse_to_the_run_s_settings(demo_page, search_dir, tmp_path):
    import html
    import re
    import shlex

    from nas.cli import main, parse

    run, page, _ = demo_page
    text = page.read_text()
    reproduce = text[text.index("<h2>Reproduce</h2>"):]
    assert f"<pre>nas demo --out {run} --quick --recipe none\nnas report {run}    # this page</pre>" in reproduce
    _, args = parse(shlex.split(f"nas demo --out {run} --quick --recipe none")[1:])  # what run_demo records, as typed
    assert (args.command, args.out, args.quick, args.seed, args.recipe) == ("demo", str(run), True, 0, "none")
    assert "<td>nas-transformers</td><td>0.2.0</td><td>search/search.json</td>" in reproduce
    out, _ = search_dir
    assert main(["report", str(out), "--out", str(tmp_path / "s.html")]) == 0
    page = (tmp_path / "s.html").read_text()
    (command,) = re.findall(r"<pre>(nas search .*?)\n", page)
    argv = shlex.split(html.unescape(command).replace("SUPERNET", str(out.parent / "supernet.pt"))
                       .replace("PREDICTOR", str(out.parent / "predictor")))
    _, args = parse(argv[1:])
    config = json.loads((out / "search.json").read_text())["config"]
    assert (args.budget, args.margin, args.seed, args.strategy) == ("6ms", 20.0, 0, "evolution")
    assert {k: getattr(args, k) for k in ("population", "parents", "mutations", "crossovers", "generations")} == {
        k: config["search"][k] for k in ("population", "parents", "mutations", "crossovers", "generations")}
    assert (args.val_windows, args.seq_len, args.verify_top, args.out) == (3, 32, 3, str(out))


def test_the_templates_ship_with_the_package():
    import fnmatch
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["nas"]
    files = [p.relative_to(ROOT / "nas").as_posix() for p in (ROOT / "nas" / "templates").rglob("*") if p.is_file()]
    assert files and all(any(fnmatch.fnmatch(f, pattern) for pattern in data) for f in files), (files, data)


def test_the_demo_records_the_command_that_makes_it_again(tmp_path):
    from nas.demo import FULL, QUICK, demo_command

    assert demo_command(tmp_path / "a b", QUICK, 3, 2, "inherit") == (f"nas demo --out '{tmp_path / 'a b'}' --quick --seed 3 "
                                                                     "--threads 2 --recipe inherit")
    assert demo_command(tmp_path, FULL, 0, None) == f"nas demo --out {tmp_path} --recipe none"  # (the default may change)


def test_the_demo_page_shows_the_deployed_model_beside_the_inherited_verdict(tmp_path):
    """With a final-training recipe the verdict stays between inherited models (the found subnet's slice against the
    baselines') and the deployed model's own bits/byte is shown beside it."""
    from nas.report import write_report
    from tests.nas.report_fakes import demo_folder

    run = demo_folder(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary.update(recipe="inherit", deployed={"bpb": 1.8123, "bpb_windows": 16, "search_bpb": 1.79, "inherited_bpb": 2.9})
    (run / "summary.json").write_text(json.dumps(summary))
    text = write_report(run).read_text()
    assert "with its inherited weights, as the baselines are scored" in text
    assert "the deployed model (inherit): bits/byte <b>1.8123</b> on the same fresh windows" in text

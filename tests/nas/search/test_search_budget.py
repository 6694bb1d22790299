import subprocess
import sys

import pytest

from nas.search import format_ms, parse_budget, parse_budgets, parse_count
from search_spaces import UserError

from tests.conftest import ROOT

FORMS = "50ms, 0.05s, 800us"


@pytest.mark.parametrize(
    "text, ms",
    [
        ("50ms", 50.0),
        ("0.05s", 50.0),
        ("800us", 0.8),
        ("800µs", 0.8),
        (" 12.5 ms ", 12.5),
        ("1e-3s", 1.0),
        ("2s", 2000.0),
        (".5ms", 0.5),
    ],
)
def test_budget_units(text, ms):
    assert parse_budget(text) == pytest.approx(ms)


@pytest.mark.parametrize(
    "text, why",
    [
        ("50", "has no unit"),
        ("0.05", "has no unit"),
        ("-5ms", "must be greater than zero"),
        ("0ms", "must be greater than zero"),
        ("0s", "must be greater than zero"),
        ("fast", "is not a latency"),
        ("ms", "is not a latency"),
        ("50 parsecs", "unknown unit 'parsecs'"),
        ("50min", "unknown unit 'min'"),
        ("nan ms", "is not a latency"),
        ("", "is not a latency"),
    ],
)
def test_bad_budgets_are_refused_with_the_accepted_forms(text, why):
    with pytest.raises(UserError) as e:
        parse_budget(text)
    message = str(e.value)
    assert message.startswith(f"--budget: {text!r}") and why in message and FORMS in message


def test_budget_lists_sorted_and_checked():
    assert parse_budgets("100ms,20ms,0.05s") == [20.0, 50.0, 100.0]
    with pytest.raises(UserError, match="repeats 50ms"):
        parse_budgets("50ms,0.05s")
    with pytest.raises(UserError, match="empty entry"):
        parse_budgets("20ms,,50ms")
    with pytest.raises(UserError, match="'x' is not a latency"):
        parse_budgets("20ms,x")


def test_budget_labels():
    assert [format_ms(x) for x in (50.0, 0.8, 12.5, 2000.0, 1500.0)] == ["50ms", "0.8ms", "12.5ms", "2s", "1.5s"]


def test_param_counts():
    assert parse_count("1500000") == 1_500_000 and parse_count("1.5M") == 1_500_000 and parse_count("800k") == 800_000
    for bad, why in (
        ("1.5q", "is not a count"),
        ("-3", "greater than zero"),
        ("0", "greater than zero"),
        ("1.5", "whole number"),
    ):
        with pytest.raises(UserError, match=why):
            parse_count(bad)


def test_cli_refuses_bad_budgets_in_one_line_before_loading_anything():
    for budget, why in (("50", "has no unit"), ("-5ms", "must be greater than zero"), ("20ms,soon", "'soon' is not a latency")):
        out = subprocess.run(
            [sys.executable, "-m", "nas", "search", "missing.pt", "--predictor", "missing.json", "--budget", budget],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert out.returncode == 2, out.stderr
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
        assert out.stderr.startswith("nas search: error: --budget:") and why in out.stderr and FORMS in out.stderr

"""scripts/_bench_common.py: the one ``run_nas`` the few-shot benchmarks share (a documented command in the
benchmark's process, its report in a log, a refusal in one line)."""

from __future__ import annotations

import pytest

from tests.script_loader import load_script


def test_run_nas_logs_each_command_and_its_report_and_a_refusal_stops_in_one_line(tmp_path, capsys):
    common = load_script("_bench_common")
    log = tmp_path / "commands.log"
    common.run_nas(["space", "tiny"], log, "bench_x")
    first = log.read_text()
    assert first.startswith("$ nas space tiny\nspace tiny  (") and capsys.readouterr().out == ""
    with pytest.raises(SystemExit) as e:
        common.run_nas(["space", "no-such-space"], log, "bench_x")
    assert str(e.value) == f"bench_x: `nas space no-such-space` exited 2 (its report: {log})"
    assert log.read_text() == first + "$ nas space no-such-space\n"


@pytest.mark.parametrize("name", ["bench_fewshot", "bench_predictor_fewshot"])
def test_the_few_shot_benchmarks_run_nas_through_the_shared_module(name):
    assert load_script(name).run_nas.__module__ == "_bench_common"

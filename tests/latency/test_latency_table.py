import csv

import pytest

from latency.campaign import run_campaign
from latency.features import table_features
from latency.sampling import campaign_subnets, retest_subset
from latency.table import TimingTable, make_meta, read_plain, read_timings
from latency.timing_core import Settings
from search_spaces import UserError

from tests.latency.latency_fakes import FakeDevice

SETTINGS = Settings(warmup=1, repeats=4, rounds=2, min_sample_ms=1.0, ref_samples=1)


def campaign(tiny, path, device=None, n=8, progress=None, memory_mb=1.0):
    device = device or FakeDevice()
    w = tiny.workload()
    subnets = campaign_subnets(tiny, n, seed=0)
    passes = {"measure": subnets, "retest": retest_subset(subnets, 0.25, seed=0)}
    names = list(table_features(tiny, subnets[0], w))
    table = TimingTable(path, make_meta(device.fingerprint(), tiny, w, SETTINGS.to_dict(), 0, names))
    run_campaign(device, tiny, w, passes, table, SETTINGS, seed=0, memory_mb=memory_mb, progress=progress)
    return table


def rows(path):
    with open(path, newline="") as f:
        return sorted((r for r in csv.DictReader(f)), key=lambda r: (r["pass"], r["key"]))


def test_campaign_writes_table_with_sidecar_and_extremes(tiny, tmp_path):
    path = tmp_path / "t.csv"
    campaign(tiny, path)
    t = read_timings(path)
    measured = t.passes("measure")
    assert len(measured) == 8 and len(t.passes("retest")) == 2
    keys = [r.key for r in t.rows if r.pass_ == "measure"]
    assert tiny.largest().key in keys and tiny.smallest().key in keys
    assert t.space.hash == tiny.hash and t.fingerprint["device"] == "fake" and t.meta["baseline_ms"] > 0
    big, small = measured[tiny.largest().key], measured[tiny.smallest().key]
    assert big.median_ms > small.median_ms and "interference" not in big.flags and small.iqr_ms == pytest.approx(0, abs=1e-6)
    for key, again in t.passes("retest").items():  # the fake device is exact: a second measurement agrees
        assert again.median_ms == pytest.approx(measured[key].median_ms, rel=1e-5)


def test_interrupted_campaign_resumes_to_the_uninterrupted_table(tiny, tmp_path):
    whole = tmp_path / "whole.csv"
    campaign(tiny, whole)

    part = tmp_path / "part.csv"

    def stop_after_a_few(done, total, info):
        if done >= 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        campaign(tiny, part, progress=stop_after_a_few)
    first = rows(part)
    assert 0 < len(first) < 10  # some chunks were written, not all
    campaign(tiny, part)  # same flags: resumes and appends
    assert [(r["key"], r["pass"], r["median_ms"], r["iqr_ms"]) for r in rows(part)] == [
        (r["key"], r["pass"], r["median_ms"], r["iqr_ms"]) for r in rows(whole)
    ]
    assert campaign(tiny, part).done["measure"] == {r["key"] for r in rows(whole) if r["pass"] == "measure"}
    assert len(rows(part)) == 10  # a finished table gains nothing


def test_mixing_fingerprints_or_spaces_in_one_file_is_refused(tiny, tmp_path):
    path = tmp_path / "t.csv"
    campaign(tiny, path, n=3)
    with pytest.raises(UserError, match=r"another device or runtime.*\n  threads: file has 1, this run has 2"):
        campaign(tiny, path, device=FakeDevice(threads=2), n=3)
    from search_spaces import load_space

    with pytest.raises(UserError, match="it holds space"):
        campaign(load_space("base"), path, n=3)
    other_settings = make_meta(FakeDevice().fingerprint(), tiny, tiny.workload(), Settings().to_dict(), 0, ["x"])
    with pytest.raises(UserError, match="its protocol is"):
        TimingTable(path, other_settings)


def corrupt(path, line, column, value):
    with open(path, newline="") as f:
        data = list(csv.reader(f))
    data[line - 1][data[0].index(column)] = value
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(data)


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("median_ms", "fast", r"line 3: column 'median_ms': 'fast' is not a number"),
        ("median_ms", "-2", r"line 3: column 'median_ms': '-2' is not a positive finite number"),
        ("subnet", "{not json", r"line 3: column 'subnet': not a subnet"),
        (
            "subnet",
            '{"embed_dim": 100, "depth": 1, "heads": [1], "ffn_dim": [128], "attention": ["softmax"]}',
            r"line 3: subnet is not in space 'tiny': embed_dim: 100",
        ),
        ("key", "0123456789abcdef", r"line 3: column 'key': '0123456789abcdef' is not the subnet's key"),
        ("pass", "again", r"line 3: column 'pass': 'again' is not one of measure, retest"),
    ],
)
def test_malformed_rows_name_the_line(tiny, tmp_path, column, value, message):
    path = tmp_path / "t.csv"
    campaign(tiny, path, n=3)
    corrupt(path, 3, column, value)
    with pytest.raises(UserError, match=message):
        read_timings(path)


def test_ragged_rows_missing_columns_and_missing_sidecar(tiny, tmp_path):
    path = tmp_path / "t.csv"
    campaign(tiny, path, n=3)
    text = path.read_text().splitlines()
    path.write_text("\n".join(text[:3] + [text[3] + ",extra"] + text[4:]) + "\n")
    with pytest.raises(UserError, match=r"line 4: has \d+ fields, the header has \d+"):
        read_timings(path)
    path.write_text(text[0].replace("median_ms", "median") + "\n" + "\n".join(text[1:]) + "\n")
    with pytest.raises(UserError, match=r"line 1: header lacks column\(s\) 'median_ms'"):
        read_timings(path)
    (tmp_path / "t.csv.json").unlink()
    with pytest.raises(UserError, match=r"no sidecar t.csv.json.*--target COLUMN"):
        read_timings(path)


def test_plain_csv_errors_name_line_and_column(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("a,b,ms\n" + "".join(f"{i},{2 * i},{i + 1}\n" for i in range(12)) + "3,x,4\n")
    with pytest.raises(UserError, match=r"line 14: column 'b': 'x' is not a number"):
        read_plain(path, "ms")
    with pytest.raises(UserError, match=r"--target: 'latency' is not a column of .* \(columns: a, b, ms\)"):
        read_plain(path, "latency")
    path.write_text("a,b,ms\n" + "".join(f"{i},{2 * i},{i + 1}\n" for i in range(12)))
    names, x, y = read_plain(path, "ms")
    assert names == ["a", "b"] and x[3] == [3.0, 6.0] and y[3] == 4.0

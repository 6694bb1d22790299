"""Workloads with a kind (prefill, decode): parsing, decode cost features, decode timing on cpu and
ONNX Runtime, tables and predictors that record their workload, and searches under decode budgets."""

from __future__ import annotations

import csv
import hashlib
import json

import numpy as np
import pytest
import torch

from latency.campaign import run_campaign
from latency.features import additive_terms, cache_bytes, flops, layer_cache_bytes, table_features
from latency.predictors.predictor import MODELS, Predictor, load_predictor, subnet_matrix
from latency.protocol import timing_model
from latency.table import TimingTable, make_meta, read_timings
from latency.timing_core import Settings
from nas.cli import main
from nas.search import AnalyticLatency
from search_spaces import Subnet, UserError, Workload, parse_attention, parse_space
from supernet import SuperTransformer
from supernet.checkpoint import save_checkpoint

from tests.latency.latency_fakes import FakeDevice

# Every attention family a decode step knows: growing key/value caches, windows, linear states.
FAMILIES = """
name: families
task: causal-lm
vocab_size: 64
max_seq_len: 64
head_dim: 8
embed_dim: [32]
depth: [1, 3]
layers:
  heads: [2]
  ffn_dim: [64]
  attention: [softmax, gqa:2, strided:4, fixed:4, 'bigbird:4:2:1', local:8, 'dilated:4:2', 'longformer:8:2',
              linear, relu-linear, cosformer:64, performer:16]
latency:
  prefill: {batch_size: 1, seq_len: 32}
  decode: {batch_size: 1, context: 40}
  wide-decode: {kind: decode, batch_size: 2, context: 200}   # rotary positions: past max_seq_len is allowed
"""
SETTINGS = Settings(warmup=1, repeats=4, rounds=2, min_sample_ms=1.0, ref_samples=1)


@pytest.fixture(scope="module")
def families():
    return parse_space(FAMILIES, where="families.yaml")


def one_layer(space, attention):
    return Subnet(space.embed_dim[0], 1, (space.heads[0],), (space.ffn_dim[0],), (attention,))


# --------------------------------------------------------------------------- parsing


def test_workloads_have_a_kind_a_shape_and_a_record(families, tiny):
    assert [(w.name, w.kind) for w in families.workloads] == [
        ("prefill", "prefill"),
        ("decode", "decode"),
        ("wide-decode", "decode"),
    ]
    wide = families.workload("wide-decode")
    assert (wide.batch_size, wide.context, wide.tokens, wide.seq_len) == (2, 200, 1, 0)
    assert str(wide) == "wide-decode (decode 2x1 at context 200)" and wide.label == "wide-decode:2x1@200"
    assert families.workload() == families.workload("prefill") and tiny.workload("decode").context == 255
    assert Workload.from_record(wide.record()) == wide
    old = {"name": "prefill", "batch_size": 1, "seq_len": 64}  # a record written before workloads had a kind
    assert Workload.from_record(old) == Workload("prefill", 1, 64)
    with pytest.raises(UserError, match="decode takes batch_size >= 1 and context >= 1"):
        Workload("d", 1, kind="decode")
    with pytest.raises(UserError, match=r"--workload: space 'families' has no latency workload 'decod' \(it has: prefill"):
        families.workload("decod")


def test_a_prefill_only_space_keeps_its_hash_and_decode_workloads_leave_the_arch_hash(tiny):
    text = (tiny.source and open(tiny.source).read())
    prefill_only = parse_space("\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("decode:")), where="t.yaml")
    assert [w.name for w in prefill_only.workloads] == ["prefill"]
    # the hash is the one a space had before workloads had kinds (checkpoints and tables store it): this form, hashed
    legacy = {"name": "tiny", "task": "causal-lm", "vocab_size": 256, "max_seq_len": 256, "head_dim": 32, "positions": "rope",
              "embed_dim": list(tiny.embed_dim), "depth": list(tiny.depth),
              "layers": {"heads": list(tiny.heads), "ffn_dim": list(tiny.ffn_dim), "attention": list(tiny.attention)},
              "latency": {"prefill": {"batch_size": 1, "seq_len": 256}}}  # fmt: skip
    assert prefill_only.hash == hashlib.sha256(json.dumps(legacy, sort_keys=True).encode()).hexdigest()[:16]
    assert prefill_only.hash != tiny.hash and prefill_only.arch_hash == tiny.arch_hash
    assert parse_space(json.dumps(tiny.to_dict()), where="again.yaml").hash == tiny.hash  # the decode form round-trips


# --------------------------------------------------------------------------- features


def test_decode_features_differ_from_prefill_and_scale_with_context_by_type(families):
    pre, dec = families.workload("prefill"), families.workload("decode")
    s = one_layer(families, "softmax")
    assert flops(families, s, dec) < flops(families, s, pre) / 10  # one token, not 32
    assert set(additive_terms(families, s, dec)) - set(additive_terms(families, s, pre)) == {"layer:cache"}
    assert table_features(families, s, dec)["cache_bytes"] > 0 and "cache_bytes" not in table_features(families, s, pre)

    def at(attention, context):
        w = Workload("d", 1, kind="decode", context=context)
        sub = one_layer(families, attention)
        return flops(families, sub, w), cache_bytes(families, sub, w)

    for attention in ("softmax", "gqa:2", "strided:4", "bigbird:4:2:1"):  # the cache grows with the context
        (f1, b1), (f2, b2) = at(attention, 1000), at(attention, 16000)
        assert f2 > 2 * f1 and b2 == pytest.approx(b1 * 16001 / 1001)
    for attention in ("local:8", "dilated:4:2", "longformer:8:2", "linear", "cosformer:64", "performer:16"):  # constant
        assert at(attention, 1000) == at(attention, 16000)
    assert at("local:8", 1000)[1] < at("softmax", 1000)[1] / 100


def test_cache_bytes_equal_the_decode_states_of_the_model(families):
    from supernet.decode import state_shapes

    w = families.workload("wide-decode")
    for attention in families.attention:
        model = timing_model(families, one_layer(families, attention), materialize=False)
        shapes = state_shapes(model, w.batch_size, w.context + 1)[0]  # growing caches with the new token's slot
        want = sum(4 * int(np.prod(shape)) for shape, _ in shapes.values())
        spec = parse_attention(attention)
        assert layer_cache_bytes(spec, w.context, families.heads[0], families.head_dim, w.batch_size) == want, attention


# --------------------------------------------------------------------------- timing a decode step


def test_cpu_times_a_decode_step_of_every_family_at_one_context(families):
    from latency.device import get_device

    device = get_device("cpu", threads=1)
    w = families.workload("decode")
    for attention in families.attention:
        model = timing_model(families, one_layer(families, attention))
        run = device.prepare(model, w)
        times = [run(3) for _ in range(2)]
        assert all(t > 0 for t in times), attention
    # every repeat sees the same context: the cache is not advanced by the timed steps
    from latency.devices.cpu import decode_setup

    for attention in ("softmax", "local:8", "linear"):
        call, cache = decode_setup(timing_model(families, one_layer(families, attention)), w)
        first = call()
        assert cache.length == w.context and first.shape == (1, 1, families.vocab_size)
        assert torch.equal(call(), first) and torch.equal(call(), first), attention


def test_onnxruntime_times_a_decode_step_of_each_family(families, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    from latency.device import get_device
    from latency.onnx_graphs import cached_decode_graph
    from latency.timing_core import decode_inputs
    from supernet.onnx_decode import decode_feed

    monkeypatch.setenv("NAS_CACHE", str(tmp_path))
    w = families.workload("wide-decode")
    # one layer of each family (a growing cache, a window, a linear state): one export
    mixed = Subnet(families.embed_dim[0], 3, (2, 2, 2), (64, 64, 64), ("softmax", "local:8", "linear"))
    model = timing_model(families, mixed, materialize=False)
    run = get_device("onnxruntime", threads=1).prepare(model, w)
    assert run(2) > 0 and run(2) > 0
    graph, _, layout = cached_decode_graph(model)  # cached: no second export
    mine, theirs = (
        decode_inputs(layout, w.batch_size, w.context),
        decode_feed(str(graph), w.batch_size, w.context, np.random.default_rng(0)),
    )
    assert {k: (v.shape, v.dtype) for k, v in mine.items()} == {k: (v.shape, v.dtype) for k, v in theirs.items()}
    assert (
        mine["past_key_values.0.key"].shape == (2, 2, 200, 8)
        and mine["past.1.k"].shape == (2, 2, 8, 8)
        and mine["past.2.s"].shape == (2, 2, 8, 8)
    )
    assert mine["position"].tolist() == [200]


# --------------------------------------------------------------------------- tables and predictors


def decode_campaign(space, path, workload, n=6):
    from latency.sampling import campaign_subnets

    device = FakeDevice()
    subnets = campaign_subnets(space, n, seed=0)
    names = list(table_features(space, subnets[0], workload))
    table = TimingTable(path, make_meta(device.fingerprint(), space, workload, SETTINGS.to_dict(), 0, names))
    run_campaign(device, space, workload, {"measure": subnets, "retest": []}, table, SETTINGS, seed=0)
    return table


def test_tables_record_their_workload_and_refuse_a_mix(tiny, tmp_path, capsys):
    path = tmp_path / "decode.csv"
    decode_campaign(tiny, path, tiny.workload("decode"))
    t = read_timings(path)
    assert t.workload == tiny.workload("decode") and t.meta["workload"]["kind"] == "decode"
    assert {r["workload"] for r in csv.DictReader(open(path))} == {"decode:1x1@255"}
    assert "cache_bytes" in t.meta["columns"]

    with pytest.raises(
        UserError, match=r"it holds timings of workload decode \(decode 1x1 at context 255\), this run measures prefill"
    ):
        decode_campaign(tiny, path, tiny.workload("prefill"))

    lines = path.read_text().splitlines()
    lines.append(lines[-1].replace("decode:1x1@255", "prefill:1x256"))  # a row of another workload pasted in
    path.write_text("\n".join(lines) + "\n")
    assert main(["fit-predictor", str(path), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert f"line {len(lines)}: column 'workload': a row of 'prefill:1x256', but the table's sidecar says 'decode:1x1@255'" in err


def fit_predictor(space, workload, directory, proxy_workload=None):
    """A real additive predictor of ``workload``, fitted to the analytic proxy at that workload."""
    rng = np.random.default_rng(0)
    subnets = [space.sample(rng) for _ in range(120)]
    x, names = subnet_matrix("additive", space, workload, subnets)
    ms = AnalyticLatency(space, workload=proxy_workload or workload.name).predict(subnets)
    regressor = MODELS["additive"](names).fit(x, ms, seed=0)
    fingerprint = {"device": "cpu", "runtime": "torch-eager", "threads": 1, "cpu_model": "Test CPU"}
    Predictor("additive", regressor, space, workload, fingerprint).save(directory)
    return directory


def test_a_predictor_refuses_another_workload(tiny, tmp_path, capsys):
    pred = load_predictor(fit_predictor(tiny, tiny.workload("decode"), tmp_path / "dec"))
    assert pred.workload == "decode" and pred.workload_spec == tiny.workload("decode")
    pred.check_workload(tiny.workload("decode"))
    with pytest.raises(
        UserError,
        match=r"asks for workload prefill \(prefill 1x256\), but this predictor was fitted on timings of workload decode",
    ):
        pred.check_workload(tiny.workload("prefill"))
    subnet = tmp_path / "s.yaml"
    subnet.write_text(tiny.smallest().to_yaml())
    assert main(["predict", "--predictor", str(tmp_path / "dec"), "--workload", "prefill", str(subnet)]) == 2
    assert "nas measure-latency --workload prefill" in capsys.readouterr().err
    assert main(["predict", "--predictor", str(tmp_path / "dec"), "--workload", "decode", str(subnet)]) == 0
    assert "decode (decode 1x1 at context 255)" in capsys.readouterr().out


# --------------------------------------------------------------------------- search


@pytest.fixture(scope="module")
def search_dir(tiny, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("search")
    save_checkpoint(tmp / "supernet.pt", SuperTransformer(tiny, generator=torch.Generator().manual_seed(0)).eval())
    (tmp / "val.txt").write_bytes(b"def f(x):\n    return x * 2\n" * 40)
    fit_predictor(tiny, tiny.workload("prefill"), tmp / "pre")
    fit_predictor(tiny, tiny.workload("decode"), tmp / "dec")
    return tmp


def search(tmp, out, *extra):
    return main(["search", str(tmp / "supernet.pt"), "--val-data", str(tmp / "val.txt"), "--val-windows", "2", "--seq-len", "32",
                 "--population", "6", "--parents", "2", "--mutations", "3", "--crossovers", "3", "--generations", "2",
                 "--out", str(tmp / out), "--no-progress", *extra])


def decode_ms(tmp, name, subnets):
    return load_predictor(tmp / name).predict(subnets)


def test_search_under_a_decode_budget_returns_subnets_within_it(tiny, search_dir, capsys):
    tmp = search_dir
    lightest = decode_ms(tmp, "dec", [tiny.smallest()])[0]
    budget = round(float(lightest) * 1.5, 3)
    assert search(tmp, "one", "--predictor", str(tmp / "dec"), "--budget", f"{budget}ms", "--workload", "decode") == 0
    best = Subnet.load(tmp / "one" / f"best_{budget:g}ms.yaml")
    assert decode_ms(tmp, "dec", [best])[0] <= budget
    summary = json.loads((tmp / "one" / "search.json").read_text())
    assert summary["workload"] == "decode" and summary["budgets"][f"{budget:g}ms"]["budgets_ms"] == {"decode": budget}
    assert "at decode (decode 1x1 at context 255)" in capsys.readouterr().err

    # a budget on a workload no predictor is fitted at is refused, naming the flag
    assert search(tmp, "one", "--predictor", str(tmp / "pre"), "--budget", "20ms", "--workload", "decode") == 2
    assert "--workload decode: no --predictor is fitted at it (they are at prefill" in capsys.readouterr().err
    assert search(tmp, "one", "--predictor", str(tmp / "pre"), "--budget", "decode:2ms") == 2
    assert "--budget: a budget on workload 'decode', but no --predictor is fitted at it" in capsys.readouterr().err
    assert search(tmp, "one", "--predictor", str(tmp / "pre"), "--predictor", str(tmp / "pre"), "--budget", "9ms") == 2
    assert "are both fitted at workload 'prefill'" in capsys.readouterr().err


def test_two_workloads_constrain_one_search(tiny, search_dir, capsys):
    tmp = search_dir
    pre_ms = decode_ms(tmp, "pre", [tiny.smallest()])[0]
    dec_ms = decode_ms(tmp, "dec", [tiny.smallest()])[0]
    pre_b, dec_b = round(float(pre_ms) * 3, 2), round(float(dec_ms) * 1.4, 3)
    args = ["--predictor", str(tmp / "pre"), "--predictor", str(tmp / "dec"), "--budget", f"prefill:{pre_b}ms,decode:{dec_b}ms"]
    assert search(tmp, "two", *args) == 0
    label = f"decode-{dec_b:g}ms+prefill-{pre_b:g}ms"
    best = Subnet.load(tmp / "two" / f"best_{label}.yaml")
    assert decode_ms(tmp, "pre", [best])[0] <= pre_b and decode_ms(tmp, "dec", [best])[0] <= dec_b
    summary = json.loads((tmp / "two" / "search.json").read_text())
    entry = summary["budgets"][label]
    assert list(summary["budgets"]) == [label] and entry["budgets_ms"] == {"prefill": pre_b, "decode": dec_b}
    assert set(entry["best"]["latency_ms_by_workload"]) == {"prefill", "decode"}
    header = (tmp / "two" / "pareto.csv").read_text().splitlines()[0]
    assert "latency_prefill_ms" in header and "latency_decode_ms" in header
    assert (tmp / "two" / "pareto_decode.png").read_bytes()[:4] == b"\x89PNG"
    # every point the search returned as feasible meets both budgets
    with open(tmp / "two" / "pareto.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(float(r["latency_ms"]) == float(r["latency_prefill_ms"]) for r in rows)

"""A prefill stated in bytes of text (issue 54, item 3): a budget means the same text whatever vocabulary a model
reads.  The space says ``prefill: {batch_size: 1, bytes: 48}``; a supernet's run measured each vocabulary's bytes per
token; every model is then timed, and its features computed, at its own vocabulary's tokens for those bytes
(``ceil(bytes / bytes_per_token)``), from the campaign to the predictor, the search and an ARM bundle."""

import csv
import json
import tarfile
from dataclasses import replace

import pytest
import torch

from latency.features import additive_terms, flops, layered_terms
from latency.protocol import measure
from latency.table import read_timings
from latency.timing_core import Settings
from nas.cli import main
from search_spaces import SpaceError, UserError, Workload, parse_space
from supernet import SuperTransformer
from supernet.checkpoint import load_checkpoint, save_checkpoint
from tests.latency.latency_fakes import FakeDevice

SPACE = """
name: text-bytes
task: causal-lm
tokenizer: {{bpe: [bytes, 320, 384]}}
max_seq_len: 64
head_dim: 8
embed_dim: [16, 32]
depth: [1, 2]
layers: {{heads: [1, 2], ffn_dim: [32, 64], attention: [softmax, 'local:8']}}
latency: {{prefill: {{batch_size: 1, {size}}}}}
"""
RATES = {256: 1.0, 320: 1.5, 384: 2.0}  # bytes per token: 48 bytes are 48, 32 and 24 tokens
TOKENS = {256: 48, 320: 32, 384: 24}


@pytest.fixture(scope="module")
def space():
    return parse_space(SPACE.format(size="bytes: 48"), "text-bytes.yaml")


def test_a_prefill_in_bytes_reads_and_writes_back(space):
    w = space.workload("prefill")
    assert (w.text_bytes, w.seq_len, w.vocab_tokens) == (48, 48, ((256, 48),))  # the byte vocabulary: a token a byte
    assert w.label == "prefill:1x48B" and str(w) == "prefill (prefill 1x48 bytes)"
    assert w.to_dict() == {"batch_size": 1, "bytes": 48}
    tokens = parse_space(SPACE.format(size="seq_len: 48"), "t.yaml")
    assert space.arch_hash == tokens.arch_hash  # the same models; only the workload differs
    resolved = space.with_bytes_per_token(RATES)
    assert resolved.hash == space.hash  # the tokens per vocabulary are measured facts, not the space's definition
    rw = resolved.workload("prefill")
    assert dict(rw.vocab_tokens) == TOKENS
    assert Workload.from_record(json.loads(json.dumps(rw.record()))) == rw  # files keep the tokens per vocabulary
    assert Workload.from_record(tokens.workload("prefill").record()) == tokens.workload("prefill")


def test_each_vocabulary_runs_its_tokens_for_the_bytes(space):
    resolved = space.with_bytes_per_token(RATES)
    for vocab, n in TOKENS.items():
        subnet = replace(space.largest(), vocab=vocab)
        assert resolved.workload("prefill").at_vocab(resolved.vocab_of(subnet)).seq_len == n
        assert resolved.workload("prefill").at_vocab(resolved.vocab_of(subnet)).label == "prefill:1x48B"  # one table
    assert resolved.workload("prefill").at_vocab(320).at_vocab(384).seq_len == 24  # resolving twice is resolving once
    assert Workload("prefill", 1, 16).at_vocab(384).seq_len == 16  # a workload in tokens is the same at any vocabulary


def test_an_unknown_rate_and_too_many_tokens_are_one_line(space):
    with pytest.raises(UserError, match=r"workload 'prefill' is stated in bytes of text \(48\): its tokens at vocabulary "
                                        r"320 need that tokenizer's bytes per token"):
        space.workload("prefill").at_vocab(320)  # the YAML's space: no tokenizer has measured them
    long = parse_space(SPACE.format(size="bytes: 200").replace("[bytes, 320, 384]", "[320, 384]"), "t.yaml")
    with pytest.raises(UserError, match=r"200 bytes of text are 134 tokens at vocabulary 320 \(1.50 bytes per token\), "
                                        r"beyond max_seq_len 64"):
        long.with_bytes_per_token({320: 1.5})


@pytest.mark.parametrize("yaml_size, message", [
    ("bytes: 100", "latency.prefill.bytes: 100 exceeds max_seq_len 64 (a byte-level model reads a token a byte)"),
    ("bytes: 48, seq_len: 48", "latency.prefill.bytes: unknown key (allowed: batch_size, seq_len, kind)"),
])  # fmt: skip
def test_a_bad_text_prefill_names_its_field(yaml_size, message):
    with pytest.raises(SpaceError) as e:
        parse_space(SPACE.format(size=yaml_size), "t.yaml")
    assert message in str(e.value)


def test_features_count_each_vocabularys_tokens(space):
    resolved = space.with_bytes_per_token(RATES)
    w = resolved.workload("prefill")
    for vocab, n in TOKENS.items():
        s = replace(space.largest(), vocab=vocab)
        tokens = Workload("prefill", 1, n)
        assert flops(resolved, s, w) == flops(resolved, s, tokens)
        assert additive_terms(resolved, s, w) == additive_terms(resolved, s, tokens)
        assert layered_terms(resolved, s, w) == layered_terms(resolved, s, tokens)
        assert layered_terms(resolved, s, w)["model:head"] == n * s.embed_dim * vocab  # the subnet's own vocabulary
    s256, s384 = (replace(space.largest(), vocab=v) for v in (256, 384))
    assert flops(resolved, s384, w) < flops(resolved, s256, w)  # half the tokens for the same text


class RecordingDevice(FakeDevice):
    def __init__(self):
        super().__init__()
        self.seen: dict[int, int] = {}

    def prepare(self, model, workload):
        self.seen[model.config.vocab_size] = workload.seq_len
        return super().prepare(model, workload)


def test_a_campaign_times_each_model_at_its_tokens(space):
    resolved = space.with_bytes_per_token(RATES)
    supernet = SuperTransformer(resolved, generator=torch.Generator().manual_seed(0)).eval()
    models = {str(v): supernet.extract(replace(space.smallest(), vocab=v)) for v in (320, 384)}
    device = RecordingDevice()
    measure(device, models, resolved.workload("prefill"), Settings(warmup=1, repeats=1, rounds=1, min_sample_ms=0.0))
    assert device.seen == {320: 32, 384: 24}  # (the default reference: a model of the first one's vocabulary)
    device.seen.clear()
    reference = supernet.extract(space.smallest())  # of bytes: it reads the bytes themselves
    measure(device, models, resolved.workload("prefill"), Settings(warmup=1, repeats=1, rounds=1, min_sample_ms=0.0),
            reference=reference)
    assert device.seen == {256: 48, 320: 32, 384: 24}


@pytest.fixture(scope="module")
def checkpoint(space, tmp_path_factory):
    """A supernet checkpoint whose run measured the rates (``meta.vocabulary.bytes_per_token``, as training writes it)."""
    root = tmp_path_factory.mktemp("text")
    supernet = SuperTransformer(space, generator=torch.Generator().manual_seed(0)).eval()
    meta = {"vocabulary": {"kind": "bpe", "sizes": list(space.vocabs), "bytes_per_token": {str(k): v for k, v in RATES.items()}}}
    return save_checkpoint(root / "ck.pt", supernet, {}, step=1, **meta)


def test_the_checkpoints_space_knows_the_tokens(checkpoint):
    assert dict(load_checkpoint(checkpoint)["space"].workload("prefill").vocab_tokens) == TOKENS


def test_measure_latency_on_the_checkpoint_times_each_vocabularys_tokens(checkpoint, tmp_path, capsys):
    table = tmp_path / "t.csv"
    assert main(["measure-latency", str(checkpoint), "--device", "cpu", "--samples", "6", "--out", str(table),
                 "--timing-warmup", "1", "--repeats", "1", "--rounds", "1", "--min-sample-ms", "0", "--retest", "0"]) == 0
    t = read_timings(table)
    assert dict(t.workload.vocab_tokens) == TOKENS and t.workload.label == "prefill:1x48B"
    space = load_checkpoint(checkpoint)["space"]
    rows = list(csv.DictReader(open(table)))
    assert {r["workload"] for r in rows} == {"prefill:1x48B"} and len({r["key"] for r in rows}) >= 4
    for row in rows:
        subnet = space.subnet_type.from_json(row["subnet"])
        n = TOKENS[space.vocab_of(subnet)]
        assert float(row["flops"]) == pytest.approx(flops(space, subnet, Workload("prefill", 1, n)))


def test_the_yaml_alone_cannot_say_the_tokens_of_a_bpe(tmp_path, capsys):
    """The YAML's space has no tokenizer to say how many tokens 48 bytes are at a BPE: one line, exit 2, no table."""
    (tmp_path / "s.yaml").write_text(SPACE.format(size="bytes: 48"))
    assert main(["measure-latency", str(tmp_path / "s.yaml"), "--device", "cpu", "--samples", "4",
                 "--out", str(tmp_path / "u.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is stated in bytes of text (48): its tokens at vocabulary" in err[0], err
    assert not (tmp_path / "u.csv").exists()


def test_an_arm_bundle_feeds_each_graph_its_tokens(checkpoint, tmp_path):
    bundle = tmp_path / "b.tar.gz"
    assert main(["measure-latency", str(checkpoint), "--device", "arm", "--bundle", str(bundle), "--samples", "3",
                 "--retest", "0"]) == 0
    with tarfile.open(bundle) as tar:
        manifest = json.load(tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("manifest.json"))))
    space = load_checkpoint(checkpoint)["space"]
    lengths = {space.vocab_of(space.subnet_type.from_json(m["subnet"])): m["seq_len"] for m in manifest["models"]}
    assert len(lengths) >= 2 and all(TOKENS[v] == n for v, n in lengths.items())
    assert manifest["reference"]["seq_len"] == TOKENS[256]  # the reference: the smallest subnet, of bytes


def test_a_saved_predictor_counts_each_subnets_tokens(space, tmp_path):
    """A predictor fitted at the text prefill keeps each vocabulary's tokens (its workload's record) and predicts a
    subnet from the features at its own vocabulary's tokens, as the search asks it."""
    import numpy as np

    from latency.predictors.predictor import MODELS, Predictor, load_predictor, subnet_matrix
    from nas.search import AnalyticLatency

    resolved = space.with_bytes_per_token(RATES)
    w = resolved.workload("prefill")
    subnets = [resolved.sample(np.random.default_rng(i)) for i in range(60)]
    x, names = subnet_matrix("additive", resolved, w, subnets)
    regressor = MODELS["additive"](names).fit(x, AnalyticLatency(resolved).predict(subnets), seed=0)
    Predictor("additive", regressor, resolved, w, {"device": "cpu", "runtime": "torch-eager", "threads": 1}).save(tmp_path)
    loaded = load_predictor(tmp_path)
    assert loaded.workload_spec == w
    for vocab, n in TOKENS.items():
        s = replace(resolved.largest(), vocab=vocab)
        at_tokens = regressor.predict(subnet_matrix("additive", resolved, Workload("prefill", 1, n), [s])[0])
        assert loaded.predict([s]) == pytest.approx(at_tokens)

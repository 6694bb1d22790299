import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from search_spaces import SpaceError, Subnet, SubnetError, load_space, parse_space
from search_spaces.attention import allowed_forms, parse_attention, types

from tests.conftest import FIXTURES, ROOT

MALFORMED = sorted((FIXTURES / "spaces").glob("*.yaml"))

MINI = """
task: causal-lm
vocab_size: 16
max_seq_len: 32
head_dim: 8
embed_dim: [8, 16]
depth: [1, 2]
layers: {heads: [1, 2], ffn_dim: [8, 16, 24], attention: [softmax, 'local:4']}
latency: {prefill: {batch_size: 1, seq_len: 32}}
"""


def expected_messages(path):
    return [line.split("# expect: ", 1)[1].strip() for line in path.read_text().splitlines() if line.startswith("# expect: ")]


def test_every_fixture_states_its_expectation():
    assert len(MALFORMED) >= 15
    for path in MALFORMED:
        assert expected_messages(path), path


@pytest.mark.parametrize("path", MALFORMED, ids=lambda p: p.stem)
def test_malformed_space_gives_its_specific_message(path):
    with pytest.raises(SpaceError) as info:
        load_space(path)
    for message in expected_messages(path):
        assert any(message in err for err in info.value.errors), f"{message!r} not in {info.value.errors}"


def test_all_errors_reported_at_once():
    with pytest.raises(SpaceError) as info:
        load_space(FIXTURES / "spaces" / "many_errors.yaml")
    assert len(info.value.errors) == 4


def test_cli_reports_space_errors_without_traceback():
    path = FIXTURES / "spaces" / "unknown_attention.yaml"
    proc = subprocess.run([sys.executable, "-m", "nas", "space", str(path)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert f"layers.attention[2]: 'sliding' is not one of {allowed_forms()}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(SpaceError, match="cannot read search space"):
        load_space(tmp_path / "nope.yaml")
    shipped = ("base, encoder-base, encoder-tiny, long, long-bpe, lra-tiny, tiny, tiny-bpe, translate-base, translate-tiny, "
               "translate-tiny-bpe, vision-tiny")
    with pytest.raises(SpaceError, match=rf"not a shipped space \(shipped: {shipped}\)"):
        load_space("huge")


def test_shipped_spaces_load_and_meet_their_scale():
    tiny, base = load_space("tiny"), load_space("search_spaces/base.yaml")
    assert {"softmax", "local", "linear"} <= {parse_attention(a).kind for a in base.attention}
    assert 640 <= base.max_embed_dim <= 768 and base.max_depth == 12 and base.max_ffn_dim == 3072 and base.max_heads == 12
    assert base.head_dim == 64
    assert tiny.max_embed_dim <= 128 and tiny.workload("prefill").seq_len <= tiny.max_seq_len


def test_space_hash_ignores_comments_but_not_choices():
    a = parse_space(MINI)
    b = parse_space("# a comment\n" + MINI)
    c = parse_space(MINI.replace("[8, 16, 24]", "[8, 16]"))
    assert a.hash == b.hash != c.hash


def test_size_matches_enumeration():
    space = parse_space(MINI)
    layers = list(space.enumerate_layers())
    count = sum(len(space.embed_dim) * len(layers) ** d for d in space.depth)
    brute = 0
    for e in space.embed_dim:
        for d in space.depth:
            brute += sum(1 for _ in itertools.product(layers, repeat=d))
    assert space.size() == count == brute == 2 * (12 + 144)


def test_sampling_is_seeded_and_covers_every_choice(tiny):
    draws = [tiny.sample(np.random.default_rng(7)) for _ in range(2)]
    assert draws[0] == draws[1]
    rng = np.random.default_rng(0)
    subnets = [tiny.sample(rng) for _ in range(1500)]
    assert all(s in tiny for s in subnets)
    assert {s.embed_dim for s in subnets} == set(tiny.embed_dim)
    assert {s.depth for s in subnets} == set(tiny.depth)
    for i in range(tiny.max_depth):  # every choice at every layer position
        at_i = [s.layers[i] for s in subnets if s.depth > i]
        assert {layer.heads for layer in at_i} == set(tiny.heads)
        assert {layer.ffn_dim for layer in at_i} == set(tiny.ffn_dim)
        assert {layer.attention for layer in at_i} == set(tiny.attention)


def test_largest_and_smallest(tiny):
    big, small = tiny.largest(), tiny.smallest()
    assert big in tiny and small in tiny
    assert big.embed_dim == max(tiny.embed_dim) and big.depth == max(tiny.depth) and set(big.ffn_dim) == {max(tiny.ffn_dim)}
    assert small.embed_dim == min(tiny.embed_dim) and small.depth == min(tiny.depth) and set(small.heads) == {min(tiny.heads)}


def test_subnet_round_trips(tiny, tmp_path):
    rng = np.random.default_rng(1)
    for _ in range(50):
        s = tiny.sample(rng)
        assert Subnet.from_yaml(s.to_yaml()) == s
        assert Subnet.from_json(s.to_json()) == s
        assert Subnet.from_dict(json.loads(json.dumps(s.to_dict()))) == s
        assert tiny.decode(tiny.encode(s)) == s
        assert tiny.encode(s).shape == (len(tiny.feature_names()),)
        assert hash(s) == hash(Subnet.from_json(s.to_json()))
    (tmp_path / "s.yaml").write_text(s.to_yaml())
    (tmp_path / "s.json").write_text(s.to_json())
    assert Subnet.load(tmp_path / "s.yaml") == Subnet.load(tmp_path / "s.json") == s


def test_subnet_key_is_stable_across_processes(tiny):
    s = tiny.sample(np.random.default_rng(3))
    code = f"from search_spaces import Subnet; print(Subnet.from_json({s.to_json()!r}).key)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout.strip()
    assert out == s.key and len(out) == 16


def test_encoding_distinguishes_subnets(tiny):
    rng = np.random.default_rng(2)
    subnets = {tiny.sample(rng) for _ in range(300)}
    codes = {tuple(tiny.encode(s)) for s in subnets}
    assert len(codes) == len(subnets)


def test_membership_errors_name_the_field(tiny):
    bad = Subnet(128, 2, (4, 3), (512, 512), ("softmax", "local:16"))
    assert bad not in tiny
    with pytest.raises(SubnetError) as info:
        tiny.check(bad)
    text = str(info.value)
    assert "heads[1]: 3 is not one of 1, 2, 4" in text
    assert f"attention[1]: 'local:16' is not one of {', '.join(tiny.attention)}" in text
    with pytest.raises(SubnetError, match=r"depth: 7 is not one of 1, 2, 3, 4"):
        tiny.check(Subnet(128, 7, (4,) * 7, (512,) * 7, ("softmax",) * 7))


@pytest.mark.parametrize(
    "data, message",
    [
        (
            {"embed_dim": 64, "depth": 2, "heads": [1], "ffn_dim": [128, 128], "attention": ["softmax"] * 2},
            "heads: has 1 entries but depth is 2",
        ),
        (
            {"embed_dim": 64, "depth": 1, "heads": [1], "ffn_dim": [128], "attention": ["softmax"], "dropout": 0},
            "unknown key 'dropout'",
        ),
        ({"embed_dim": 64, "depth": 1, "heads": [1], "ffn_dim": [128]}, "missing key 'attention'"),
        (
            {"embed_dim": 0, "depth": 1, "heads": [1], "ffn_dim": [128], "attention": ["softmax"]},
            "embed_dim: 0 is not a positive integer",
        ),
        ({"embed_dim": 64, "depth": 1, "heads": [1], "ffn_dim": [128], "attention": ["sparse"]}, "'sparse' is not one of"),
        (
            {"embed_dim": 64, "depth": 1, "heads": [1], "ffn_dim": [128], "attention": ["softmax "]},
            "write 'softmax', not 'softmax '",
        ),
    ],
)
def test_malformed_subnets(data, message):
    with pytest.raises(SubnetError, match=message):
        Subnet.from_dict(data)


def test_decode_rejects_wrong_length(tiny):
    with pytest.raises(SubnetError, match="feature vector has shape"):
        tiny.decode(np.zeros(3))


def test_attention_grammar():
    assert str(parse_attention("local:64")) == "local:64"
    assert parse_attention("local:64").param("W") == 64
    assert set(types()) >= {"softmax", "local", "linear"}
    with pytest.raises(ValueError, match="must be written local:W"):
        parse_attention("local:1:2")

"""task: seq2seq spaces: the shipped ones, subnets (sampling, membership, round trips) and features."""

import numpy as np
import pytest

from search_spaces import SubnetError, load_space
from tasks.translation.space import TranslationSpace, TranslationSubnet
from tasks.translation.data import VOCAB_SIZE


@pytest.fixture(scope="module")
def space():
    return load_space("translate-tiny")


def test_shipped_translation_spaces(space):
    base = load_space("translate-base")
    assert isinstance(base, TranslationSpace) and base.task == "seq2seq" and base.vocab_size == VOCAB_SIZE == 259
    for side in (base.encoder, base.decoder):
        assert side.embed_dim == (512, 640) and side.ffn_dim == (1024, 2048, 3072) and side.heads == (4, 8)
    assert base.encoder.depth == (6,) and base.decoder.depth == (1, 2, 3, 4, 5, 6) and base.cross_layers == (1, 2, 3)
    assert base.encoder.attention_form == "bidirectional" and base.decoder.attention_form == "causal"  # each side's form
    assert not base.encoder.causal and base.decoder.causal
    w = base.workload("translate")
    assert (w.source, w.steps, w.beam, w.kind) == (30, 30, 5, "translate")
    assert space.cross_layers == (1, 2, 3) and space.encoder.max_embed_dim <= 128 and space.decoder.max_depth <= 3


def test_sampling_is_seeded_covers_choices_and_round_trips(space, tmp_path):
    a = [space.sample(np.random.default_rng(5)) for _ in range(2)]
    assert a[0] == a[1]
    subnets = [space.sample(np.random.default_rng(i)) for i in range(200)]
    assert {k for s in subnets for k in s.cross_layers} == {1, 2, 3} and {s.decoder.depth for s in subnets} == {1, 2, 3}
    assert {s.encoder.embed_dim for s in subnets} == {64, 96} and len({s.key for s in subnets}) > 190
    for s in subnets[:20] + [space.largest(), space.smallest()]:
        assert s in space
        assert space.decode(space.encode(s)) == s
        assert TranslationSubnet.from_json(s.to_json()) == s
        (tmp_path / "s.yaml").write_text(s.to_yaml())
        assert TranslationSubnet.load(tmp_path / "s.yaml") == s
    vecs = {tuple(space.encode(s)) for s in subnets}
    assert len(vecs) == len({s.key for s in subnets}) and len(space.feature_names()) == len(space.encode(subnets[0]))


def test_membership_names_the_field(space):
    s = space.largest()
    bad = TranslationSubnet(s.encoder, s.decoder, (2, 3, 2), (1, 4, 2))
    with pytest.raises(SubnetError) as e:
        space.check(bad)
    assert "decoder.cross_heads[1]: 3 is not one of 1, 2" in str(e.value)
    assert "decoder.cross_layers[1]: 4 is not one of 1, 2, 3" in str(e.value)
    with pytest.raises(SubnetError, match=r"subnet.decoder.cross_layers: expected a tuple of 3 \(decoder depth\)"):
        TranslationSubnet(s.encoder, s.decoder, (2, 2, 2), (1, 2))
    with pytest.raises(SubnetError, match="expected a TranslationSubnet, got Subnet"):
        space.check(s.encoder)

"""Decoding: cached decoding equals uncached decoding (greedy token for token, beam search in tokens and scores)."""

import math

import numpy as np
import pytest
import torch

from tasks.translation.model import TranslationSuperTransformer
from tasks.translation.decode import beam_search, greedy, score_translations
from tasks.translation.data import EOS

from tests.tasks.translation.translation_fakes import mini_space


@pytest.fixture(scope="module")
def model():
    space = mini_space()
    m = TranslationSuperTransformer(space, generator=torch.Generator().manual_seed(3)).eval()
    with torch.no_grad():  # sharper, varied distributions than the initial near-uniform ones
        for p in m.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return m


def subnets(space):
    rng = np.random.default_rng(7)
    return [space.largest(), space.smallest()] + [space.sample(rng) for _ in range(4)]


def test_cached_greedy_equals_uncached_token_for_token(model):
    space = model.space
    seen_types = set()
    for subnet in subnets(space):
        w = model.extract(subnet).weights()
        seen_types |= set(subnet.decoder.attention)
        for source in (b"file not found", b"x"):
            a = greedy(w, source, space.max_seq_len, max_len=14, cache=True)
            b = greedy(w, source, space.max_seq_len, max_len=14, cache=False)
            assert a.tokens == b.tokens and len(a.tokens) >= 2
            assert math.isclose(a.score, b.score, rel_tol=0, abs_tol=1e-4)
            assert all(0 <= t < 256 or t == EOS for t in a.tokens)
    assert seen_types == {"softmax", "local:4", "linear"}  # every cache kind of the space was exercised


def test_cached_beam_search_equals_uncached_in_tokens_and_scores(model):
    space = model.space
    for subnet in subnets(space)[:4]:
        w = model.extract(subnet).weights()
        a = beam_search(w, b"open the file", space.max_seq_len, beam=4, max_len=10, cache=True)
        b = beam_search(w, b"open the file", space.max_seq_len, beam=4, max_len=10, cache=False)
        assert [h.tokens for h in a] == [h.tokens for h in b] and len(a) >= 4
        assert np.allclose([h.score for h in a], [h.score for h in b], atol=1e-4)
        assert [h.normalized for h in a] == sorted((h.normalized for h in a), reverse=True)
        # the beam's best is at least as likely (per byte) as greedy's answer when greedy's answer ended in time
        g = greedy(w, b"open the file", space.max_seq_len, max_len=10)
        if g.ended:
            assert a[0].normalized >= g.normalized - 1e-6


def test_chrf_and_bleu_with_sacrebleu():
    refs = ["Die Datei wurde nicht gefunden", "Öffnen Sie die neue Datei"]
    assert score_translations(refs, refs) == {"chrf": 100.0, "bleu": pytest.approx(100.0)}
    partial = score_translations(["Die Datei wurde nicht geöffnet"], refs[:1])
    assert 0 < partial["chrf"] < 100 and 0 <= partial["bleu"] < 100

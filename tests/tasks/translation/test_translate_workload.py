"""HAT's translate workload: the runner that devices will time, and its analytic cost terms."""

import dataclasses

import pytest
import torch

from tasks.translation.features import translate_terms
from tasks.translation.space import TranslationWorkload
from tasks.translation.model import TranslationSuperTransformer
from tasks.translation.decode import translate_runner
from tasks.translation.data import BOS

from tests.tasks.translation.translation_fakes import mini_space


def test_runner_encodes_once_and_decodes_n_cached_steps_at_the_beam():
    space = mini_space()
    model = TranslationSuperTransformer(space, generator=torch.Generator().manual_seed(0)).extract(space.largest()).eval()
    workload = space.workload("translate")
    out = translate_runner(model, workload, torch.Generator().manual_seed(1))()
    assert out.shape == (workload.beam, workload.steps + 1) and (out[:, 0] == BOS).all()
    assert ((out[:, 1:] < 256) | (out[:, 1:] == 258)).all()


def test_translate_terms_count_the_arbitrary_attention():
    space = mini_space()
    w = TranslationWorkload("translate", source=10, steps=4, beam=3)
    base = space.largest()
    one = dataclasses.replace(base, cross_layers=(1, 1))
    three = dataclasses.replace(base, cross_layers=(3, 1))
    t1, t3 = translate_terms(space, one, w), translate_terms(space, three, w)
    assert t1["memory_positions"] == 20 and t3["memory_positions"] == 40
    a, ee, ed, hd = 2 * 8, 24, 24, 8  # largest: 2 cross heads of 8, widths 24
    # layer 0 reads 3 x 10 instead of 10 memory positions: k and v of 20 more positions, and attention over them
    assert t3["cross_kv_flops"] - t1["cross_kv_flops"] == pytest.approx(2.0 * 20 * ee * a * 2)
    assert t3["cross_attention_flops"] - t1["cross_attention_flops"] == pytest.approx(2.0 * 4 * 3 * 2 * 20 * hd * 2)
    for k in ("encoder_flops", "decoder_self_flops", "decoder_mlp_flops", "head_flops"):
        assert t3[k] == t1[k]
    assert t1["head_flops"] == 2.0 * 4 * 3 * ed * 259
    assert t3["flops"] == pytest.approx(sum(v for k, v in t3.items() if k.endswith("_flops") and k != "flops"))
    assert t3["cache_bytes"] > t1["cache_bytes"]

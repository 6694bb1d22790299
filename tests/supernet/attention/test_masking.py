"""BERT-style masking for the masked-LM task: choices, corruptions, the loss on the chosen positions only."""

import math

import pytest
import torch

from tasks.masked_lm.masking import IGNORE, MASK_BYTE, MaskingSettings, bits_per_masked_byte, mask_tokens, masked_loss


def _batch(b=64, t=200, seed=0):
    # bytes below 0xFF, like UTF-8 text: a MASK_BYTE in the inputs can only come from masking
    return torch.randint(0, 255, (b, t), generator=torch.Generator().manual_seed(seed))


def test_exactly_the_rate_is_chosen_per_sequence_and_the_rest_is_untouched():
    idx = _batch()
    inputs, targets = mask_tokens(idx, MaskingSettings(), torch.Generator().manual_seed(1))
    chosen = targets != IGNORE
    assert (chosen.sum(1) == 30).all()  # round(0.15 * 200)
    assert torch.equal(targets[chosen], idx[chosen])
    assert torch.equal(inputs[~chosen], idx[~chosen])


def test_the_chosen_are_80_percent_masked_10_random_10_kept():
    idx = _batch()
    inputs, targets = mask_tokens(idx, MaskingSettings(), torch.Generator().manual_seed(2))
    chosen = targets != IGNORE
    n = int(chosen.sum())  # 64 x 30 = 1920
    masked = float((inputs[chosen] == MASK_BYTE).sum()) / n
    kept = float((inputs[chosen] == idx[chosen]).sum()) / n  # kept, plus random draws of the same byte (1/256 of 10%)
    other = 1.0 - masked - kept
    # binomial standard deviations at n = 1920: 0.009 (80%), 0.007 (10%); 4 of them
    assert abs(masked - 0.8) < 0.04 and abs(kept - 0.1) < 0.03 and abs(other - 0.1) < 0.03, (masked, kept, other)


def test_masking_is_seeded():
    idx = _batch(4, 50)
    a = mask_tokens(idx, MaskingSettings(), torch.Generator().manual_seed(3))
    b = mask_tokens(idx, MaskingSettings(), torch.Generator().manual_seed(3))
    c = mask_tokens(idx, MaskingSettings(), torch.Generator().manual_seed(4))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[1], c[1])


def test_the_loss_is_on_the_chosen_positions_only_in_bits():
    idx = _batch(2, 40)
    _, targets = mask_tokens(idx, MaskingSettings(rate=0.25), torch.Generator().manual_seed(5))
    logits = torch.randn(2, 40, 256, generator=torch.Generator().manual_seed(6))
    chosen = targets != IGNORE
    by_hand = -torch.log_softmax(logits, -1)[chosen].gather(1, targets[chosen][:, None]).mean()
    torch.testing.assert_close(masked_loss(logits, targets), by_hand)
    assert bits_per_masked_byte(logits, targets) == pytest.approx(float(by_hand) / math.log(2))
    other = logits.clone()
    other[~chosen] = 0.0  # the unchosen positions do not count
    torch.testing.assert_close(masked_loss(other, targets), by_hand)


@pytest.mark.parametrize("rate", [0.0, 1.0, -0.1, 1.5])
def test_a_mask_rate_outside_0_1_is_refused(rate):
    with pytest.raises(ValueError, match=rf"^mask rate {rate}: expected a fraction strictly between 0 and 1$"):
        MaskingSettings(rate=rate)


def test_bad_corruption_fractions_and_mask_byte_are_refused():
    with pytest.raises(ValueError, match="mask replace 0.95 and random 0.1: expected non-negative fractions summing to at most"):
        MaskingSettings(replace=0.95)
    with pytest.raises(ValueError, match=r"mask byte 256: expected an id in 0..255"):
        MaskingSettings(mask_byte=256)

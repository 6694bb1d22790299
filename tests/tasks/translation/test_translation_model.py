"""The encoder-decoder supernet: extraction equals the supernet, HAT's arbitrary encoder-decoder attention."""

import dataclasses

import numpy as np
import pytest
import torch

from tasks.translation.space import TranslationSubnet
from tasks.translation.model import TranslationSuperTransformer, encode, encode_memory, memory
from tasks.translation.data import PAD

from tests.tasks.translation.translation_fakes import mini_space


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 256, (3, 12), generator=g)
    src[1, 9:] = PAD  # a shorter source, padded
    return src, torch.randint(0, 256, (3, 10), generator=g)


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_extracted_model_equals_the_supernet_running_its_subnet(positions):
    space = mini_space(positions)
    model = TranslationSuperTransformer(space, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # trained-looking weights: no zero biases or unit norms hiding a slicing mistake
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    src, tgt = batch()
    rng = np.random.default_rng(0)
    subnets = [space.largest(), space.smallest()] + [space.sample(rng) for _ in range(8)]
    for subnet in subnets:
        static = model.extract(subnet)
        with torch.no_grad():
            want, got = model(src, tgt, subnet), static(src, tgt)
        assert got.shape == (3, 10, 259)
        assert (want - got).abs().max().item() <= 1e-5, subnet
        assert static.num_params() == model.num_params(subnet)
        supernet_storage = {p.untyped_storage().data_ptr() for p in model.parameters()}
        assert not supernet_storage & {p.untyped_storage().data_ptr() for p in static.parameters()}
    # different subnets compute different things (the slices matter)
    with torch.no_grad():
        assert (model(src, tgt, subnets[0]) - model(src, tgt, subnets[1])).abs().max() > 1e-3


def test_arbitrary_encoder_decoder_attention_reads_the_last_k_encoder_layers():
    space = mini_space()
    model = TranslationSuperTransformer(space, generator=torch.Generator().manual_seed(1))
    src, tgt = batch(1)
    largest = space.largest()
    subnet = dataclasses.replace(largest, cross_layers=(1, 3))
    w = model.weights(subnet)
    with torch.no_grad():
        final, outs = encode(w, src)
        assert len(outs) == 3 and final.shape == outs[-1].shape == (3, 12, 24)
        # HAT: the final (normalised) output, then the raw outputs of the layers before the last, along the sequence
        assert torch.equal(memory(final, outs, 3), torch.cat([final, outs[1], outs[0]], dim=1))
        assert torch.equal(memory(final, outs, 1), final)
        mem = encode_memory(w, src)
    assert [k.shape[2] for k, _ in mem.kv] == [12, 36]  # keys of decoder layer i span cross_layers[i] x S positions
    assert [tuple(m.shape) for m in mem.mask] == [(3, 1, 1, 12), (3, 1, 1, 36)]
    assert mem.mask[1][1, 0, 0].tolist() == ([True] * 9 + [False] * 3) * 3  # the source padding, once per layer read
    # the choice changes what the decoder computes
    outputs = {}
    with torch.no_grad():
        for k in (1, 2, 3):
            outputs[k] = model(src, tgt, TranslationSubnet(largest.encoder, largest.decoder, largest.cross_heads, (k, k)))
    assert all((outputs[a] - outputs[b]).abs().max() > 1e-4 for a, b in ((1, 2), (2, 3), (1, 3)))


def test_cross_attention_ignores_source_padding_in_the_memory():
    """Cross-attention masks PAD keys: zeroing the memory rows at PAD positions leaves the decoder's output unchanged."""
    space = mini_space()
    model = TranslationSuperTransformer(space, generator=torch.Generator().manual_seed(2))
    src, tgt = batch(2)
    w = model.weights(space.largest())
    from tasks.translation.model import Memory, decode

    with torch.no_grad():
        mem = encode_memory(w, src)
        keep = mem.mask
        scrambled = Memory(tuple((k.masked_fill(~m.transpose(-1, -2), 7.0), v.masked_fill(~m.transpose(-1, -2), -3.0))
                                 for (k, v), m in zip(mem.kv, keep)), keep)  # fmt: skip
        a, _ = decode(w, tgt, mem)
        b, _ = decode(w, tgt, scrambled)
    assert (a - b).abs().max().item() <= 1e-6

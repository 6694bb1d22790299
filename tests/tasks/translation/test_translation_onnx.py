"""ONNX of an encoder-decoder: the encoder graph's cross keys / values and the decoder step's logits equal torch,
for a decoder of softmax, local and linear self-attention (the cache fed back), at batch 1 and at a beam's batch."""

import numpy as np
import pytest
import torch

from search_spaces import UserError, parse_space
from tasks.translation.space import TranslationSubnet
from tasks.translation.onnx import (
    OnnxBeams,
    OnnxTranslation,
    export_translation_onnx,
    onnx_greedy,
    onnx_logits,
    onnx_translate,
    translation_parity,
)
from tasks.translation.model import TranslationSuperTransformer, decode, encode_memory
from tasks.translation.decode import beam_search, greedy, search_beams
from tasks.translation.data import BOS
from tests.tasks.translation.translation_fakes import MINI_SEQ2SEQ

# translate-tiny's types on both sides, each decoder layer reading another number of encoder layers
SUBNET = {
    "encoder": {"embed_dim": 24, "depth": 3, "heads": [2, 1, 2], "ffn_dim": [32, 16, 32],
                "attention": ["local:4", "linear", "softmax"]},
    "decoder": {"embed_dim": 16, "depth": 3, "heads": [2, 1, 2], "ffn_dim": [32, 16, 32],
                "attention": ["softmax", "local:4", "linear"], "cross_heads": [2, 1, 2], "cross_layers": [1, 2, 3]},
}  # fmt: skip


def three_layer_space(positions: str = "rope"):
    text = MINI_SEQ2SEQ.replace("depth: [1, 2]", "depth: [1, 2, 3]").format(positions=positions)
    return parse_space(text, where="mini-s2s.yaml")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    space = three_layer_space()
    supernet = TranslationSuperTransformer(space, generator=torch.Generator().manual_seed(0))
    model = supernet.extract(TranslationSubnet.from_dict(SUBNET)).eval()
    directory = tmp_path_factory.mktemp("s2s-onnx")
    export_translation_onnx(model, directory)
    yield model, directory, OnnxTranslation.load(directory, threads=1)
    torch.set_num_threads(threads)


@pytest.mark.parametrize("length", [3, 11, 40])  # shorter than the local window, longer, max_seq_len
def test_encoder_graph_equals_encode_memory(exported, length):
    model, _, ort = exported
    src = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        mem = encode_memory(model.weights(), src)
    cross = ort.encode(src.numpy(), 1)
    for i, ((k, v), mask) in enumerate(zip(mem.kv, mem.mask)):
        dec = SUBNET["decoder"]
        key, value = cross[f"past_key_values.{i}.encoder.key"], cross[f"past_key_values.{i}.encoder.value"]
        assert key.shape == (1, dec["cross_heads"][i], dec["cross_layers"][i] * length, 8)
        diff = max(np.abs(key - k.numpy()).max(), np.abs(value - v.numpy()).max())
        print(f"layer {i}: max abs difference of the cross keys / values {diff:.2e}")
        assert diff < 1e-5
        assert (cross[f"encoder_attention_mask.{i}"] == mask.numpy()).all()


@pytest.mark.parametrize("batch", [1, 3])
def test_decoder_step_equals_torch_decode(exported, batch):
    """Teacher forcing through the step graph from empty caches (each state fed back) equals the torch decoder."""
    model, _, ort = exported
    g = torch.Generator().manual_seed(batch)
    src, tgt = torch.randint(0, 256, (1, 9), generator=g), torch.randint(0, 256, (batch, 14), generator=g)
    tgt[:, 0] = BOS
    with torch.no_grad():
        mem = encode_memory(model.weights(), src).select(torch.zeros(batch, dtype=torch.long))
        ref, _ = decode(model.weights(), tgt, mem)  # (B, T, V), no cache
    got = onnx_logits(ort, src.numpy(), tgt.numpy())
    diff = np.abs(got - ref.numpy()).max()
    print(f"batch {batch}: max abs logit difference over 14 steps {diff:.2e}")
    assert got.shape == (batch, 14, 259) and diff < 1e-4


def test_beam_reorder_of_the_onnx_states(exported):
    """Gathering the states by hypothesis (beam search) continues each row from its parent's prefix."""
    model, _, ort = exported
    g = torch.Generator().manual_seed(5)
    src, tgt = torch.randint(0, 256, (1, 9), generator=g), torch.randint(0, 256, (3, 10), generator=g)
    tgt[:, 0] = BOS
    index = np.array([2, 0, 0])
    feed = ort.start(ort.encode(src.numpy(), 3))
    for t in range(5):
        feed["input_ids"] = tgt[:, t : t + 1].numpy()
        ort.step(feed)
    ort.reorder(feed, index)
    moved = torch.cat([tgt[index, :5], tgt[:, 5:]], dim=1)  # row r: its parent's prefix, then its own tokens
    got = []
    for t in range(5, 10):
        feed["input_ids"] = moved[:, t : t + 1].numpy()
        got.append(ort.step(feed))
    with torch.no_grad():
        mem = encode_memory(model.weights(), src).select(torch.zeros(3, dtype=torch.long))
        ref, _ = decode(model.weights(), moved, mem)
    assert np.abs(np.stack(got, 1) - ref[:, 5:].numpy()).max() < 1e-4


def test_onnx_beam_search_equals_torch_beam_search(exported):
    """The same search over the step graph: each hypothesis its parent's cache (reordered states), the cross
    keys / values following the live batch; tokens equal, scores within fp32 rounding."""
    model, _, ort = exported
    for source, beam in ((b"file not found", 3), (b"x", 4)):
        a = beam_search(model.weights(), source, model.space.max_seq_len, beam=beam, max_len=10)
        b = search_beams(OnnxBeams(ort, source), beam, 10)
        assert [h.tokens for h in a] == [h.tokens for h in b] and len(a) >= beam
        assert np.allclose([h.score for h in a], [h.score for h in b], atol=1e-3)
        best = onnx_translate(ort, source, model.space.max_seq_len, beam=beam, max_len=10)
        assert best.tokens == a[0].tokens
    with pytest.raises(UserError, match="this model reads at most"):
        onnx_translate(ort, b"y" * (model.space.max_seq_len + 1), model.space.max_seq_len, beam=2)


def test_onnx_greedy_equals_torch_greedy(exported):
    model, directory, ort = exported
    tokens, score = onnx_greedy(ort, b"file not found", max_len=12)
    ref = greedy(model.weights(), b"file not found", model.space.max_seq_len, max_len=12)
    assert tuple(tokens) == ref.tokens and abs(score - ref.score) < 1e-3
    parity = translation_parity(model, directory)
    assert parity["encoder"] < 1e-5 and parity["decoder_step"] < 1e-4, parity

"""The ONNX decode step: ONNX Runtime generation equals torch decoding for every attention family."""

import numpy as np
import pytest
import torch

from search_spaces import LayerChoice, UserError
from supernet.decode import decode_step, new_cache
from supernet.model import Transformer, TransformerConfig
from supernet.onnx_decode import (
    decode_feed,
    empty_feed,
    export_decode_onnx,
    input_layout,
    onnx_decode_logits,
    onnx_generate,
    onnx_session,
    read_layout,
)

VOCAB, MAX_LEN = 64, 64
# One layer of every type in one graph (softmax/gqa, window, full-cache sparse, linear family): one
# export keeps the test fast, and a wrong layer anywhere shows in the logits.
EVERY_TYPE = ["softmax", "gqa:2", "local:5", "dilated:3:2", "strided:4", "fixed:4", "longformer:4:3", "bigbird:4:2:1",
              "linear", "relu-linear", "cosformer:64", "performer:16"]  # fmt: skip


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_model(specs, positions="rope", seed=0):
    cfg = TransformerConfig(VOCAB, MAX_LEN, 8, positions, 32, tuple(LayerChoice(4, 48, s) for s in specs))
    g = torch.Generator().manual_seed(seed)
    model = Transformer(cfg, generator=g).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3, generator=g)  # peaked attention: mistakes show in the logits
    return model


@pytest.fixture(scope="module")
def every_type(tmp_path_factory):
    torch.set_num_threads(1)
    model = make_model(EVERY_TYPE)
    path = export_decode_onnx(model, tmp_path_factory.mktemp("onnx") / "step.onnx")
    return model, path, onnx_session(path, threads=1)


def torch_decode(model, idx):
    cache, out = new_cache(model, idx.shape[0]), []
    for t in range(idx.shape[1]):
        logits, cache = decode_step(model, idx[:, t : t + 1], cache)
        out.append(logits)
    return torch.cat(out, 1).numpy()


@pytest.mark.parametrize("batch", [2, 3])
def test_onnx_step_equals_torch_decode_for_every_type(every_type, batch):
    model, _, session = every_type
    idx = torch.randint(0, VOCAB, (batch, 30), generator=torch.Generator().manual_seed(batch))  # crosses windows, blocks
    onnx_logits = onnx_decode_logits(session, idx.numpy())  # (B, T, V), starting from empty caches
    ref = torch_decode(model, idx)
    assert onnx_logits.shape == (batch, 30, VOCAB)
    assert np.abs(onnx_logits - ref).max() <= 1e-4
    with torch.no_grad():
        assert np.abs(onnx_logits - model(idx).numpy()).max() <= 1e-4


def test_onnx_generate_equals_torch_greedy_generation(every_type):
    model, _, session = every_type
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(7))
    new = onnx_generate(session, prompt.numpy(), 20)
    # torch: the same greedy loop on decode_step
    cache, tokens, expect = new_cache(model, 2), prompt, []
    for t in range(5):
        logits, cache = decode_step(model, prompt[:, t : t + 1], cache)
    for _ in range(20):
        nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        expect.append(nxt)
        logits, cache = decode_step(model, nxt, cache)
    assert new.shape == (2, 20) and np.array_equal(new, torch.cat(expect, 1).numpy())
    sampled = [onnx_generate(session, prompt.numpy(), 8, temperature=1.0, rng=np.random.default_rng(s)) for s in (1, 1, 2)]
    assert np.array_equal(sampled[0], sampled[1]) and not np.array_equal(sampled[0], sampled[2])


def test_decode_feed_from_graph_or_model_times_a_step_at_long_context(every_type):
    model, path, session = every_type
    assert read_layout(path) == read_layout(session) == input_layout(model)
    feed = decode_feed(path, 1, 4096, np.random.default_rng(0))
    again = decode_feed(model, 1, 4096, np.random.default_rng(0))
    assert feed.keys() == again.keys() and all(np.array_equal(feed[n], again[n]) for n in feed)  # seeded, same layout
    assert feed["past.0.k"].shape == (1, 4, 4096, 8) and feed["past.1.k"].shape == (1, 2, 4096, 8)  # softmax, gqa:2 grow
    assert feed["past.2.k"].shape == (1, 4, 5, 8) and feed["past.8.s"].shape == (1, 4, 8, 8)  # window, linear: constant
    assert feed["position"].tolist() == [4096]
    logits = session.run(["logits"], feed)[0]  # past max_seq_len: rope is computed at any position
    assert logits.shape == (1, 1, VOCAB) and np.isfinite(logits).all()
    assert empty_feed(path, 3)["past.0.k"].shape == (3, 4, 0, 8)


def test_learned_positions_graph_and_its_limit(tmp_path):
    model = make_model(["gqa:1", "longformer:4:3", "performer:16"], "learned", seed=2)
    session = onnx_session(export_decode_onnx(model, tmp_path / "step.onnx"), threads=1)
    idx = torch.randint(0, VOCAB, (2, MAX_LEN), generator=torch.Generator().manual_seed(3))
    assert np.abs(onnx_decode_logits(session, idx.numpy()) - torch_decode(model, idx)).max() <= 1e-4
    with pytest.raises(UserError, match="context 64 is past max_seq_len 64: the model has learned positions"):
        decode_feed(session, 1, MAX_LEN, np.random.default_rng(0))


def test_a_prefill_graph_is_not_a_step_graph(tmp_path):
    from supernet.onnx_export import export_onnx

    path = export_onnx(make_model(["softmax"]), tmp_path / "model.onnx")
    with pytest.raises(UserError, match="not a decode-step graph"):
        decode_feed(path, 1, 8, np.random.default_rng(0))

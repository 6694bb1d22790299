"""The ONNX decode step: ONNX Runtime generation equals torch decoding for every attention family."""

import numpy as np
import pytest
import torch

from search_spaces import LayerChoice, UserError
from supernet.decode import decode_step, new_cache
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
from tests.supernet.test_decode import MAX_LEN, VOCAB, one_thread  # noqa: F401  (one_thread: an autouse fixture)
from tests.supernet.test_decode import make_model as _make_model

# One layer of every type in one graph (softmax/gqa, window, full-cache sparse, linear family): one
# export keeps the test fast, and a wrong layer anywhere shows in the logits.
EVERY_TYPE = ["softmax", "gqa:2", "local:5", "dilated:3:2", "strided:4", "fixed:4", "longformer:4:3", "bigbird:4:2:1",
              "linear", "relu-linear", "cosformer:64", "performer:16",
              "hydra", "sima", "lsra:3", "msla:3", "convmod:4"]  # fmt: skip


def make_model(specs, positions="rope", seed=0):
    return _make_model([LayerChoice(4, 48, s) for s in specs], positions, seed)


@pytest.fixture(scope="module")
def every_type(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the export traces many tiny ops
    model = make_model(EVERY_TYPE)
    path = export_decode_onnx(model, tmp_path_factory.mktemp("onnx") / "step.onnx")
    yield model, path, onnx_session(path, threads=1)
    torch.set_num_threads(threads)


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
    cache, expect = new_cache(model, 2), []
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
    # softmax, gqa:2 grow: optimum's names; a window and a linear state: constant, named past.{i}.{name}
    assert feed["past_key_values.0.key"].shape == (1, 4, 4096, 8) and feed["past_key_values.1.value"].shape == (1, 2, 4096, 8)
    assert feed["past.2.k"].shape == (1, 4, 5, 8) and feed["past.8.s"].shape == (1, 4, 8, 8)
    assert feed["position"].tolist() == [4096] and feed["input_ids"].shape == (1, 1)
    assert [o.name for o in session.get_outputs()][:3] == ["logits", "present.0.key", "present.0.value"]
    logits = session.run(["logits"], feed)[0]  # past max_seq_len: rope is computed at any position
    assert logits.shape == (1, 1, VOCAB) and np.isfinite(logits).all()
    assert empty_feed(path, 3)["past_key_values.0.key"].shape == (3, 4, 0, 8)


def test_learned_positions_graph_and_its_limit(tmp_path):
    model = make_model(["gqa:1", "longformer:4:3", "performer:16"], "learned", seed=2)
    session = onnx_session(export_decode_onnx(model, tmp_path / "step.onnx"), threads=1)
    idx = torch.randint(0, VOCAB, (2, MAX_LEN), generator=torch.Generator().manual_seed(3))
    assert np.abs(onnx_decode_logits(session, idx.numpy()) - torch_decode(model, idx)).max() <= 1e-4
    with pytest.raises(UserError, match="context 64 is past max_seq_len 64: the model has learned positions"):
        decode_feed(session, 1, MAX_LEN, np.random.default_rng(0))


def test_stitched_timing_step_graph_decodes_like_torch_for_every_type(every_type, tmp_path):
    """The decode-step graphs that timing uses are stitched from one generic part per attention type:
    with a model's own weights they decode exactly like torch, for other widths too, with the whole export's compute ops."""
    from latency.onnx_graphs import cached_decode_graph, with_weights
    from supernet.onnx_export import op_counts

    def with_own_weights(model, graph, tensors):
        return onnx_session(with_weights(graph, tensors, model, tmp_path / f"own-{graph.stem}"), threads=1)

    model, whole, _ = every_type
    graph, tensors, layout = cached_decode_graph(model, tmp_path)
    assert len(list((tmp_path / "generic").glob("*.onnx"))) == len(EVERY_TYPE) + 2  # + the step's embedding and the head
    assert layout == read_layout(graph) == input_layout(model)  # decode_feed / onnx_generate take it like an export
    assert sorted(t["name"] for t in tensors) == sorted(model.state_dict())  # every weight once, none inline
    session = with_own_weights(model, graph, tensors)
    idx = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(4))  # from empty caches, across windows
    assert np.abs(onnx_decode_logits(session, idx.numpy()) - torch_decode(model, idx)).max() <= 1e-4
    stitched, one_piece = op_counts(graph), op_counts(whole)
    for op in ("MatMul", "Attention", "LayerNormalization", "Gelu", "Gather", "ReduceSum", "Exp", "Cos", "Sin"):
        assert stitched[op] == one_piece[op], op  # (weight transposes and shape arithmetic: folded by ONNX Runtime)

    # other head counts, FFN and model widths reuse the generic parts (no export); learned positions need their own
    other = _make_model([LayerChoice(h, f, s) for h, f, s in [(2, 24, "softmax"), (6, 40, "local:5"), (3, 16, "linear")]], seed=5)
    session = with_own_weights(other, *cached_decode_graph(other, tmp_path)[:2])
    assert len(list((tmp_path / "generic").glob("*.onnx"))) == len(EVERY_TYPE) + 2
    assert np.abs(onnx_decode_logits(session, idx.numpy()) - torch_decode(other, idx)).max() <= 1e-4
    learned = make_model(["softmax", "linear"], "learned", seed=6)
    session = with_own_weights(learned, *cached_decode_graph(learned, tmp_path)[:2])
    assert np.abs(onnx_decode_logits(session, idx.numpy()) - torch_decode(learned, idx)).max() <= 1e-4


def test_a_prefill_graph_is_not_a_step_graph(tmp_path):
    from supernet.onnx_export import export_onnx

    path = export_onnx(make_model(["softmax"]), tmp_path / "model.onnx")
    with pytest.raises(UserError, match="not a decode-step graph"):
        decode_feed(path, 1, 8, np.random.default_rng(0))


# --------------------------------------------------------------------------- the cached decoder (optimum's names)

KV_TYPES = ["softmax", "gqa:2", "strided:4", "fixed:4", "bigbird:4:2:1"]  # every layer a growing key/value cache


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    model = make_model(KV_TYPES, seed=8)
    path = export_decode_onnx(model, tmp_path_factory.mktemp("cached") / "step.onnx")
    return model, path, onnx_session(path, threads=1)


def test_the_cached_decoder_takes_a_prompt_and_steps_with_optimums_names(cached):
    """A model whose layers all keep a key/value cache exports the cached decoder: input_ids of any length after any
    past, positions read off the cache (no position input), past_key_values.{i}.key / .value in, present out."""
    model, path, session = cached
    assert [i.name for i in session.get_inputs()] == ["input_ids"] + [f"past_key_values.{i}.{kv}" for i in range(5)
                                                                       for kv in ("key", "value")]  # fmt: skip
    assert [o.name for o in session.get_outputs()] == ["logits"] + [f"present.{i}.{kv}" for i in range(5)
                                                                     for kv in ("key", "value")]  # fmt: skip
    idx = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        full = model(idx).numpy()
    for prompt in (0, 1, 17, 30):  # one token at a time, or a prompt in one call (empty past) then one at a time
        assert np.abs(onnx_decode_logits(session, idx.numpy(), prompt=prompt) - full).max() <= 1e-4, prompt
    feed = decode_feed(path, 1, 200, np.random.default_rng(0))
    assert "position" not in feed and feed["input_ids"].shape == (1, 1)
    assert feed["past_key_values.1.key"].shape == (1, 2, 200, 8)  # gqa:2 keeps its 2 key/value heads
    out = session.run(None, feed)
    assert out[0].shape == (1, 1, VOCAB) and out[1].shape == (1, 4, 201, 8)  # present: one entry longer


def test_cached_decoder_generates_as_torch_and_the_step_form_stays_available(cached, tmp_path):
    model, _, session = cached
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(7))
    new = onnx_generate(session, prompt.numpy(), 12)  # the prompt in one call
    cache, expect = new_cache(model, 2), []
    for t in range(5):
        logits, cache = decode_step(model, prompt[:, t : t + 1], cache)
    for _ in range(12):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        expect.append(nxt)
        logits, cache = decode_step(model, nxt, cache)
    assert np.array_equal(new, torch.cat(expect, 1).numpy())
    assert "position" in input_layout(model, cached=False) and "position" not in input_layout(model)
    with pytest.raises(UserError, match="needs every layer to keep a key/value cache"):
        input_layout(make_model(["softmax", "local:5"]), cached=True)
    step_form = onnx_session(export_decode_onnx(model, tmp_path / "one.onnx", cached=False), threads=1)
    with pytest.raises(UserError, match="a prompt in one call needs the cached decoder graph"):
        onnx_decode_logits(step_form, prompt.numpy(), prompt=3)


def test_a_step_graph_of_an_older_export_is_refused_in_one_line(every_type, tmp_path):
    """A graph exported before the field's names (token, past.0.k) is refused by what reads it, saying to export again."""
    import json

    from supernet.onnx_export import add_metadata

    _, path, _ = every_type
    old = tmp_path / "step.onnx"
    old.write_bytes(path.read_bytes())
    layout = {("token" if n == "input_ids" else n.replace("past_key_values.", "past.").replace(".key", ".k")
               .replace(".value", ".v")): spec for n, spec in read_layout(path).items()}  # fmt: skip
    add_metadata(old, {"decode_inputs": json.dumps(layout)})
    for reader in (lambda: read_layout(old), lambda: decode_feed(old, 1, 8, np.random.default_rng(0)),
                   lambda: onnx_generate(onnx_session(old, threads=1), np.zeros((1, 2), np.int64), 2)):
        with pytest.raises(UserError, match=r"exported by an older nas-transformers \(inputs token, past.0.k, past.0.v; "
                                            r".*export the model again with `nas export`"):
            reader()

"""Memory for causal models (issue 57): a space's ``memory: M`` (Transformer-XL's cached previous segment with rotary
positions) carried by training, the decoding cache, the latency of a decode step, the export and long documents."""

import json

import numpy as np
import pytest
import torch

from search_spaces import SpaceError, UserError, parse_space
from supernet import SuperTransformer
from supernet.decode import decode_logits, decode_step, new_cache, prefill, stream_bits
from supernet.memory import detach_memory

MEM = """
name: mem
task: causal-lm
vocab_size: 64
max_seq_len: 16
head_dim: 8
positions: rope
memory: 6
embed_dim: [32]
depth: [1, 2]
layers:
  heads: [1, 2]
  ffn_dim: [64]
  attention: [softmax, "gqa:1"]
latency:
  prefill: {batch_size: 1, seq_len: 16}
  decode: {batch_size: 1, context: 100}
"""


@pytest.fixture(scope="module")
def space():
    return parse_space(MEM, where="mem.yaml")


@pytest.fixture(scope="module")
def model(space):
    supernet = SuperTransformer(space, generator=torch.Generator().manual_seed(0)).eval()
    return supernet.extract(space.largest()).eval()


def test_the_space_option_and_what_it_refuses(space):
    plain = parse_space(MEM.replace("memory: 6\n", ""), where="mem.yaml")
    assert space.memory == 6 and plain.memory == 0
    assert "memory" not in plain.to_dict() and space.to_dict()["memory"] == 6 and space.hash != plain.hash
    for text, line in (
        (MEM.replace("memory: 6", "memory: 16"), "memory: 16 tokens leave no room for a segment: memory must be below "
                                                 "max_seq_len 16"),
        (MEM.replace("positions: rope", "positions: learned"), "memory: needs positions: rope (relative positions "
                                                               "across segments), not learned"),
        (MEM.replace('"gqa:1"', '"local:4"'), "memory: local:4 cannot carry a memory (its decoding cache does not attend "
                                              "to every key it holds); the types that can: gqa, softmax"),
        (MEM.replace("memory: 6", "memory: -1"), "memory: -1 is not a positive number of tokens"),
        (MEM.replace("causal-lm", "masked-lm"), "memory: only a causal model (a decoder) carries a memory of its previous "
                                                "segment"),
    ):
        with pytest.raises(SpaceError) as e:
            parse_space(text, where="mem.yaml")
        assert f"mem.yaml: {line}" in str(e.value).splitlines()


def test_training_scores_the_segment_and_cuts_the_memory_from_the_gradient(space, model, monkeypatch):
    import supernet.model as static

    from supernet.heldout import IGNORE
    from supernet.task import task_for

    learner = task_for(space)
    tokens = np.arange(1000) % 64
    x, y = learner.batch(tokens, np.array([0, 5]), slice(0, 2), 16, 0)
    assert (y[:, :6] == IGNORE).all()  # the memory predicts nothing scored; the segment its next tokens
    assert y[:, 6:].tolist() == [tokens[7:17].tolist(), tokens[12:22].tolist()] and x[0].tolist() == tokens[:16].tolist()
    assert learner.heldout(tokens, np.array([3]), 16).tokens == 10 and learner.to_dict() == {"memory": 6}
    with pytest.raises(UserError, match=r"^--seq-len: 6 tokens leave no segment after the memory of 6 tokens"):
        learner.batch(tokens, np.array([0]), slice(0, 1), 6, 0)
    h = torch.randn(2, 10, 4, requires_grad=True)
    out = detach_memory(h, 3)
    assert torch.equal(out, h)
    (out * torch.randn(2, 10, 4)).sum().backward()
    assert (h.grad[:, :3] == 0).all() and (h.grad[:, 3:] != 0).all()
    # in the model: the memory's embeddings get no gradient from the segment's loss (stop-gradient at every layer)
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(3))
    probe = torch.zeros(2, 16, 32, requires_grad=True)
    embed = static.embed
    monkeypatch.setattr(static, "embed", lambda *a, **k: embed(*a, **k) + probe)
    try:
        model.train()
        learner.loss(model(idx), torch.where(torch.arange(16) < 6, IGNORE, idx)).backward()
    finally:
        model.eval()
        model.zero_grad()
    assert (probe.grad[:, :6] == 0).all() and probe.grad[:, 6:].abs().sum() > 0
    assert model.blocks[0].attn.k.weight.requires_grad  # (the projections themselves learn from the memory's keys)


def test_decoding_keeps_the_memory_at_a_bounded_cost_and_onnx_carries_it(model, tmp_path):
    from supernet.onnx_decode import decode_feed, export_decode_onnx, onnx_decode_logits, read_layout
    from supernet.onnx_export import onnx_session

    x = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(x[:, :16])
        cache, slots = new_cache(model, 2), []
        outs = []
        for t in range(40):
            logits, cache = decode_step(model, x[:, t : t + 1], cache)
            outs.append(logits)
            slots.append(cache.valid)
        dec = torch.cat(outs, 1)
    assert (dec[:, :16] - full).abs().max() <= 1e-5  # within the first window: the model's own logits
    assert max(slots) == 16 and slots[16] == 7 and slots[26] == 7 and cache.length == 40  # trimmed to the memory, then on
    assert torch.equal(dec, decode_logits(model, x))
    with torch.no_grad():  # without trimming (the same weights, no memory) the logits past the window differ
        plain = type(model)(model.config.__class__(**{**model.config.__dict__, "memory": 0}))
        plain.load_state_dict(model.state_dict())
        unbounded = decode_logits(plain.eval(), x)
    assert (unbounded[:, :16] - dec[:, :16]).abs().max() <= 1e-5 and (unbounded[:, 16:] - dec[:, 16:]).abs().max() > 1e-3
    step = export_decode_onnx(model, tmp_path / "step.onnx")
    layout = read_layout(step)
    assert layout["position"]["memory"] == 6 and layout["position"]["window"] == 16
    got = onnx_decode_logits(onnx_session(step), x.numpy())
    assert np.abs(got - dec.numpy()).max() <= 1e-4  # the ONNX generation loop trims as torch does
    feed = decode_feed(step, 1, 100, np.random.default_rng(0))
    assert feed["past_key_values.0.key"].shape[2] == 15 and int(feed["position"][0]) == 100  # a step reads at most 15 entries
    # prefill then decode: the same
    with torch.no_grad():
        lg, c = prefill(model, x[:, :10])
        for t in range(10, 40):
            lg, c = decode_step(model, x[:, t : t + 1], c)
    assert (lg[:, 0] - dec[:, 39]).abs().max() <= 1e-5


def test_a_memory_model_takes_the_one_token_step_and_other_graphs_keep_their_form_and_names(model):
    """The cached decoder (issue 53) reads positions off its caches' length and masks by their indices, which a cache
    trimmed to the memory no longer gives: a memory model's step graph takes the position as an input; a model without
    one keeps the cached decoder, its feeds untouched by the memory's trimming and its graph cache's names."""
    from latency.onnx_graphs import config_key
    from latency.timing_core import decode_inputs
    from supernet.decode import keeps_kv_cache
    from supernet.memory import trim_feed
    from supernet.onnx_decode import input_layout, is_cached

    plain = type(model)(model.config.__class__(**{**model.config.__dict__, "memory": 0})).eval()
    assert keeps_kv_cache(plain) and not keeps_kv_cache(model)
    layout = input_layout(model)
    assert not is_cached(layout) and layout["input_ids"]["shape"] == ["batch", 1]
    assert layout["position"] == {"shape": [1], "dtype": "int64", "limit": None, "memory": 6, "window": 16}
    with pytest.raises(UserError) as e:
        input_layout(model, cached=True)
    assert str(e.value) == ("the cached decoder graph needs every layer to keep a key/value cache and no memory; "
                            f"{model.subnet} has a memory")
    cached = input_layout(plain)
    assert is_cached(cached) and "position" not in cached
    feed = decode_inputs(cached, 1, 20)  # no position, no memory: the caches hold the whole context
    assert feed["past_key_values.0.key"].shape[2] == 20 and trim_feed(dict(feed), cached).keys() == feed.keys()
    assert trim_feed(dict(feed), cached)["past_key_values.0.key"] is feed["past_key_values.0.key"]
    assert config_key(plain.config) == "715245652e508d5f"  # the name main gave it before memory was a field
    assert config_key(model.config) != config_key(plain.config)


def test_the_model_folder_config_names_the_memory_and_optimum_is_not_offered(space):
    from supernet.model_folder import optimum_ready, stack_config

    plain = parse_space(MEM.replace("memory: 6\n", ""), where="mem.yaml")
    sub = space.largest()
    config = stack_config(space, sub, "causal-lm")
    assert config["mem_len"] == 6 and "mem_len" not in stack_config(plain, sub, "causal-lm")
    assert optimum_ready(config) == ("it reads on with a memory of the previous segment's last 6 tokens, whose "
                                     "positions its trimmed cache does not give, so its step.onnx takes the position "
                                     "as an input (no cached decoder)")
    assert "memory" not in (optimum_ready(stack_config(plain, sub, "causal-lm", use_cache=True)) or "")


def test_a_decode_step_with_memory_is_timed_and_featured_at_its_bounded_cache(space, model):
    from latency.devices.cpu import decode_setup
    from latency.features import table_features
    from latency.onnx_graphs import cached_decode_graph
    from latency.timing_core import decode_inputs

    far, near = space.workload("decode"), space.workload("decode").__class__("decode", 1, 0, "decode", 15)
    sub = space.largest()
    assert table_features(space, sub, far) == table_features(space, sub, near)  # context 100 reads 15 entries
    plain = parse_space(MEM.replace("memory: 6\n", ""), where="mem.yaml")
    assert table_features(plain, sub, far)["cache_bytes"] > table_features(plain, sub, near)["cache_bytes"]
    _, _, layout = cached_decode_graph(model)
    feed = decode_inputs(layout, 1, 100)
    assert feed["past_key_values.0.key"].shape[2] == 15 and int(feed["position"][0]) == 100
    call, cache = decode_setup(model, far)
    assert cache.valid == 15 and cache.length == 100 and call().shape == (1, 1, 64)


def test_long_documents_read_with_and_without_the_memory(model):
    rng = np.random.default_rng(0)
    short = [rng.integers(0, 64, 12) for _ in range(2)]
    assert stream_bits(model, short, memory=True) == pytest.approx(stream_bits(model, short, memory=False), abs=1e-9)
    long = [rng.integers(0, 64, 40) for _ in range(3)]
    a, b = stream_bits(model, long, memory=True), stream_bits(model, long, memory=False)
    assert np.isfinite(a) and np.isfinite(b) and a != b


def test_train_measure_fit_search_and_export_with_a_memory(tmp_path, graph_cache):
    from nas.cli import main
    from supernet.artifact import read_card

    (tmp_path / "mem.yaml").write_text(MEM)
    text = bytes(np.random.default_rng(0).integers(32, 64, 20000, dtype=np.uint8))
    (tmp_path / "text.txt").write_bytes(b"\n".join(text[i : i + 80] for i in range(0, len(text), 80)))  # lines: chunks
    assert main(["train-supernet", str(tmp_path / "mem.yaml"), "--out", str(tmp_path / "run"), "--data",
                 str(tmp_path / "text.txt"), "--max-steps", "4", "--batch-size", "4", "--seq-len", "16", "-q"]) == 0
    ckpt = torch.load(tmp_path / "run" / "final.pt", weights_only=True)
    assert ckpt["meta"]["objective"]["memory"] == 6
    q = ["--timing-threads", "1", "--timing-warmup", "1", "--repeats", "2", "--rounds", "1", "--min-sample-ms", "1", "-q"]
    assert main(["measure-latency", str(tmp_path / "mem.yaml"), "--device", "onnxruntime", "--workload", "decode",
                 "--out", str(tmp_path / "t.csv"), "--samples", "12", "--retest", "0", *q]) == 0
    assert main(["fit-predictor", str(tmp_path / "t.csv"), "--models", "additive", "--out", str(tmp_path / "p"), "-q"]) == 0
    assert main(["search", str(tmp_path / "run" / "final.pt"), "--predictor", str(tmp_path / "p"), "--workload", "decode",
                 "--budget", "1s", "--out", str(tmp_path / "s"), "--population", "4", "--parents", "2", "--mutations", "1",
                 "--crossovers", "1", "--generations", "1", "--val-windows", "2", "--seq-len", "16", "--no-progress",
                 "-q"]) == 0
    best = next((tmp_path / "s").glob("best_*.yaml"))
    assert main(["export", str(tmp_path / "run" / "final.pt"), "--subnet", str(best), "--out", str(tmp_path / "m"),
                 "--format", "onnx", "--seq-len", "16", "--val-windows", "2", "--timing-target", "onnxruntime",
                 "--workload", "decode", *q]) == 0
    card = read_card(tmp_path / "m")
    assert card["space"]["memory"] == 6 and card["decode_step"]["memory"]["parity_max_abs"] <= 1e-4
    assert card["decode_step"]["memory"]["checked_tokens"] == 27 and card["measured"]["median_ms"] > 0
    assert json.loads(json.dumps(card["validation"]))["bits_per_byte"] > 0

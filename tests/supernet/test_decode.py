"""Incremental decoding equals the full forward for every attention type; caches hold what they should."""

import pytest
import torch

from search_spaces import LayerChoice, UserError, parse_attention
from search_spaces.attention import types
from supernet import DecodeCache, cache_bytes, decode_step, new_cache, prefill, synthetic_cache
from supernet.attention import get
from supernet.model import Transformer, TransformerConfig, rope_tables
from tests.supernet.test_train import one_thread  # noqa: F401  (autouse: tiny ops, and two threads spin badly on a busy machine)

VOCAB, MAX_LEN, HEAD_DIM, EMBED = 64, 64, 8, 32
T = 40  # decoded length: crosses every window and block below several times
# Every type, with windows / blocks / strides well below T so the decode crosses them.
SPECS = [
    "softmax", "gqa:1", "gqa:2",
    "local:1", "local:5", "dilated:3:2", "dilated:4:3",
    "strided:4", "fixed:4", "longformer:4:3", "longformer:6:9", "bigbird:4:2:1", "bigbird:3:1:2",
    "linear", "relu-linear", "cosformer:64", "performer:16",
    "hydra", "sima", "lsra:2", "lsra:5", "msla:3", "convmod:2", "convmod:6",
]  # fmt: skip


def make_model(layers, positions="rope", seed=0):
    """A tiny model with large random weights, so that attention is peaked and mistakes show in the logits."""
    cfg = TransformerConfig(VOCAB, MAX_LEN, HEAD_DIM, positions, EMBED, tuple(layers))
    g = torch.Generator().manual_seed(seed)
    model = Transformer(cfg, generator=g).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3, generator=g)
    return model


def tokens(b=2, t=T, seed=1):
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def decoded_logits(model, idx, t0):
    """prefill(idx[:, :t0]) then one decode_step per remaining token; logits (B, T, V)."""
    if t0:
        logits, cache = prefill(model, idx[:, :t0])
    else:
        logits, cache = torch.zeros(idx.shape[0], 0, VOCAB), new_cache(model, idx.shape[0])
    out = [logits]
    for t in range(t0, idx.shape[1]):
        step_logits, cache = decode_step(model, idx[:, t : t + 1], cache)
        out.append(step_logits)
    assert cache.length == idx.shape[1]
    return torch.cat(out, dim=1)


def test_every_attention_type_is_covered():
    decoders = {name for name, typ in types().items() if "causal" in typ.forms}  # encoder-only types do not decode
    assert {parse_attention(s).kind for s in SPECS} == decoders and decoders < set(types())


@pytest.mark.parametrize("positions", ["rope", "learned"])
@pytest.mark.parametrize("spec", SPECS)
def test_decode_equals_full_forward(spec, positions):
    model = make_model([LayerChoice(4, 48, spec), LayerChoice(2, 48, spec)], positions)
    idx = tokens()
    with torch.no_grad():
        full = model(idx)  # (2, T, V)
    for t0 in (0, 1, 7):  # empty cache, one token, a prompt that does not fill the windows
        assert (decoded_logits(model, idx, t0) - full).abs().max().item() <= 1e-4, t0


def test_decode_of_mixed_type_model_equals_full_forward():
    types = ("softmax", "local:5", "linear", "gqa:2", "longformer:4:3", "cosformer:64", "bigbird:4:2:1", "performer:16")
    layers = [LayerChoice(4, 48, s) for s in types]
    for positions in ("rope", "learned"):
        model = make_model(layers, positions, seed=3)
        idx = tokens(seed=4)
        with torch.no_grad():
            full = model(idx)
        assert (decoded_logits(model, idx, 11) - full).abs().max().item() <= 1e-4


def test_parity_is_sensitive_to_the_pattern_and_the_position():
    """The checks above could not pass by accident: a wrong window or a wrong position changes the logits."""
    idx = tokens()
    local, softmax = make_model([LayerChoice(4, 48, "local:5")]), make_model([LayerChoice(4, 48, "softmax")])
    with torch.no_grad():
        assert (local(idx) - softmax(idx)).abs().max().item() > 1e-2  # same weights, the window matters
        _, cache = prefill(local, idx[:, :10])
        cache.length += 1  # decode the next token one position too far
        wrong, _ = decode_step(local, idx[:, 10:11], cache)
        assert (wrong[:, 0] - local(idx[:, :11])[:, -1]).abs().max().item() > 1e-2


def test_prefill_logits_equal_forward_and_refuse_bad_tokens():
    model = make_model([LayerChoice(2, 48, "local:5")])
    idx = tokens(t=MAX_LEN)
    logits, cache = prefill(model, idx)
    assert torch.equal(logits, model(idx)) and cache.length == MAX_LEN and cache.batch_size == 2
    with pytest.raises(UserError, match="exceeds max_seq_len 64"):
        prefill(model, tokens(t=MAX_LEN + 1))
    with pytest.raises(UserError, match=r"shape \(batch, 1\)"):
        decode_step(model, idx[:, :2], cache)
    with pytest.raises(UserError, match="3 tokens for a cache of batch size 2"):
        decode_step(model, tokens(b=3, t=1), cache)


def test_rope_decodes_past_max_seq_len_learned_positions_refuse():
    rope = make_model([LayerChoice(2, 48, "local:5")])
    cache = synthetic_cache(rope, 1, 16_000, torch.Generator().manual_seed(0))
    logits, cache = decode_step(rope, tokens(b=1, t=1), cache)
    assert logits.shape == (1, 1, VOCAB) and torch.isfinite(logits).all() and cache.length == 16_001
    learned = make_model([LayerChoice(2, 48, "local:5")], "learned")
    _, cache = prefill(learned, tokens(b=1, t=MAX_LEN))
    with pytest.raises(UserError, match="decode position 64 is past max_seq_len 64: this model has learned positions"):
        decode_step(learned, tokens(b=1, t=1), cache)


def test_rope_at_any_position_matches_the_table():
    from supernet.model import rope_at

    cos, sin = rope_tables(MAX_LEN, HEAD_DIM)
    c2, s2 = rope_at(torch.arange(MAX_LEN), HEAD_DIM)
    assert torch.equal(cos, c2) and torch.equal(sin, s2)


@pytest.mark.parametrize(
    "spec,kind",
    [("softmax", "kv"), ("gqa:1", "kv"), ("local:8", "window"), ("linear", "linear"), ("cosformer:64", "linear"),
     ("hydra", "linear"), ("sima", "linear"), ("msla:3", "linear"), ("convmod:4", "window")],  # fmt: skip
)
def test_cache_memory_constant_for_window_and_linear_grows_for_softmax(spec, kind):
    model = make_model([LayerChoice(4, 48, spec)] * 2)
    assert any(s.grows for s in get(spec).state(parse_attention(spec), 4, HEAD_DIM).values()) == (kind == "kv")
    sizes = [cache_bytes(synthetic_cache(model, 1, n, spare=0)) for n in (512, 2048, 16384)]
    if kind == "kv":
        kvh = 1 if spec == "gqa:1" else 4  # gqa keeps only its key/value heads
        assert sizes == [2 * 2 * kvh * n * HEAD_DIM * 4 for n in (512, 2048, 16384)]
    else:
        assert sizes[0] == sizes[1] == sizes[2] > 0
    # and decoding keeps it so: 60 more tokens leave a window / linear cache the same size
    _, cache = prefill(model, tokens(b=1, t=20), capacity=20)  # full: a key/value cache must grow
    before = cache_bytes(cache)
    for t in range(60):
        _, cache = decode_step(model, tokens(b=1, t=1, seed=t), cache)
    assert (cache_bytes(cache) == before) == (kind != "kv")


def test_synthetic_cache_has_the_shapes_of_a_real_one():
    layers = [LayerChoice(4, 48, s) for s in ("softmax", "gqa:2", "longformer:4:3", "dilated:3:2", "performer:16")]
    model = make_model(layers)
    _, real = prefill(model, tokens(t=30), capacity=30)
    fake = synthetic_cache(model, 2, 30, torch.Generator().manual_seed(0), spare=0)
    assert isinstance(fake, DecodeCache) and fake.length == real.length == 30
    for a, b in zip(real.layers, fake.layers):
        assert {n: (t.shape, t.dtype) for n, t in a.items()} == {n: (t.shape, t.dtype) for n, t in b.items()}
    again = synthetic_cache(model, 2, 30, torch.Generator().manual_seed(0), spare=0)
    assert all(torch.equal(a[n], b[n]) for a, b in zip(fake.layers, again.layers) for n in a)  # seeded
    assert fake.layers[1]["k"].shape[1] == 2  # gqa:2 keeps two key/value heads


def test_kv_cache_regrows_past_its_capacity():
    model = make_model([LayerChoice(2, 48, "softmax")])
    idx = tokens(t=MAX_LEN)
    _, cache = prefill(model, idx[:, :5], capacity=5)
    assert cache.layers[0]["k"].shape[2] == 5  # full: the next step must regrow
    out = [decode_step(model, idx[:, t : t + 1], cache)[0] for t in range(5, MAX_LEN)]
    assert (torch.cat(out, 1) - model(idx)[:, 5:]).abs().max().item() <= 1e-4


# --------------------------------------------------------------------------- generate


def byte_model(spec="local:5", positions="rope", max_len=MAX_LEN, seed=5):
    cfg = TransformerConfig(256, max_len, HEAD_DIM, positions, EMBED, (LayerChoice(4, 48, spec), LayerChoice(4, 48, "softmax")))
    model = Transformer(cfg, generator=torch.Generator().manual_seed(seed)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0)  # sharper distributions than the init's near-uniform ones
    return model


@torch.no_grad()
def uncached_generate(model, prompt, n, temperature, top_k, generator, window=None):
    """The loop `generate` had before the cache: the full model on the context for every token.

    ``window(tokens, start) -> start`` moves the context's first token (default: the last max_seq_len)."""
    tokens, start = list(prompt), 0
    for _ in range(n):
        start = window(tokens, start) if window else max(0, len(tokens) - model.config.max_seq_len)
        logits = model(torch.tensor([tokens[start:]]))[0, -1]
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            kth = torch.topk(logits, top_k).values[-1]
            probs = torch.softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)
            nxt = int(torch.multinomial(probs, 1, generator=generator))
        tokens.append(nxt)
    return bytes(tokens[len(prompt) :])


def test_generate_with_cache_samples_what_the_uncached_loop_did():
    from supernet.generate import generate

    for spec in ("local:5", "linear", "bigbird:4:2:1"):
        model = byte_model(spec)
        seeded = lambda: torch.Generator().manual_seed(11)  # noqa: E731
        out = generate(model, b"def f(x):", 50, temperature=0.8, top_k=40, generator=seeded())
        assert out == uncached_generate(model, b"def f(x):", 50, 0.8, 40, seeded())  # within max_seq_len
        # past max_seq_len, 'slide' is the uncached sliding window exactly
        out = generate(model, b"def f(x):", 150, temperature=0.8, top_k=40, generator=seeded(), overflow="slide")
        assert len(out) == 150 and out == uncached_generate(model, b"def f(x):", 150, 0.8, 40, seeded())


def test_generate_reprefills_the_last_keep_tokens_past_max_seq_len():
    from supernet.generate import generate

    model = byte_model("gqa:2", "learned")
    prompt = bytes(range(40, 140))  # longer than max_seq_len: its last 64 bytes are the context
    jump = lambda tokens, start: len(tokens) - 20 if len(tokens) - start > MAX_LEN else start  # noqa: E731
    expect = uncached_generate(model, prompt, 120, 0.0, None, None, window=lambda t, s: jump(t, max(s, len(prompt) - MAX_LEN)))
    assert generate(model, prompt, 120, temperature=0, overflow="reprefill", keep=20) == expect
    assert generate(model, prompt, 120, temperature=0, keep=20) == expect  # the default mode
    assert generate(model, prompt, 120, temperature=0, overflow="slide") != expect  # a different context indeed


def test_generate_continue_decodes_past_max_seq_len_where_the_model_can():
    from supernet.generate import generate

    short = byte_model("local:5")
    long = byte_model("local:5", max_len=256)  # same weights (rope: no position table to differ)
    long.load_state_dict(short.state_dict())
    out = generate(short, b"hello", 150, temperature=0, overflow="continue")
    assert out == uncached_generate(long, b"hello", 150, 0.0, None, None)  # the full model on all 155 tokens
    with pytest.raises(UserError, match="overflow 'continue': this model has learned positions"):
        generate(byte_model("local:5", "learned"), b"x", 5, overflow="continue")
    with pytest.raises(UserError, match="cosformer:64 is defined only up to position 64"):
        generate(byte_model("cosformer:64"), b"x", 5, overflow="continue")
    with pytest.raises(UserError, match="keep: 0; expected 1 ... max_seq_len 64"):
        generate(short, b"x", 5, keep=0)


def test_generate_cli_uses_the_cache_and_reports_bad_flags(tiny, tmp_path, capsys):
    from nas.cli import main
    from search_spaces import Subnet
    from supernet.artifact import save_model
    from supernet.generate import generate

    subnet = Subnet(64, 2, (2, 2), (128, 128), ("local:32", "linear"))
    model = Transformer(TransformerConfig.from_subnet(tiny, subnet), generator=torch.Generator().manual_seed(0))
    save_model(model, tmp_path / "m", tiny)
    n = tiny.max_seq_len + 20  # past max_seq_len
    args = ["--prompt", "ab", "--max-new-tokens", str(n), "--seed", "3", "--overflow", "continue"]
    assert main(["generate", "--model", str(tmp_path / "m"), *args]) == 0
    expect = generate(model, b"ab", n, generator=torch.Generator().manual_seed(3), overflow="continue")
    assert capsys.readouterr().out == "ab" + expect.decode("utf-8", errors="replace") + "\n"
    assert main(["generate", "--model", str(tmp_path / "m"), "--keep", "0"]) == 2
    assert f"keep: 0; expected 1 ... max_seq_len {tiny.max_seq_len}" in capsys.readouterr().err

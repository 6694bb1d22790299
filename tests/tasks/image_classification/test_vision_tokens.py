"""Token keeping in image spaces (issue 57): per layer the share of tokens its block runs, a searched width; the space's
gene, the elastic model and its extraction, ONNX with a static top-k, the latency features, and the commands."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from nas.cli import main
from search_spaces import SpaceError, SubnetError, load_space, parse_space
from tasks.image_classification.space import VisionSubnet
from tasks.image_classification.tokens import keep_tokens, kept

from tests.tasks.image_classification.test_vision import SPACE, idx_folder

KEEP = SPACE.replace("attention: [softmax, linear]}", "attention: [softmax, linear, axial]}\nkeep: [1.0, 0.7, 0.5]")


def space_of(tmp_path, text: str = KEEP):
    (tmp_path / "s.yaml").write_text(text)
    return load_space(str(tmp_path / "s.yaml"))


def test_a_layer_runs_its_block_on_its_best_scored_tokens_and_the_rest_skip_it():
    h = torch.arange(2 * 10 * 3, dtype=torch.float32).reshape(2, 10, 3)
    w = torch.tensor([[0.0, 1.0, 0.0]])  # the score: the token's middle feature
    score = (w, torch.zeros(1))
    h[1, :, 1] = torch.tensor([5.0, 9.0, 1.0, 7.0, 0.0, 8.0, 2.0, 6.0, 3.0, 4.0])  # image 1: its own order
    seen = []

    def run(x):
        seen.append(x.clone())
        return x + 100.0

    y = keep_tokens(h, score, 0.5, run)
    assert kept(10, 0.5) == 5 and kept(10, 0.7) == 7 and kept(49, 0.7) == 35 and kept(3, 0.1) == 1
    assert seen[0].shape == (2, 5, 3)
    changed = (y != h).any(-1)  # (B, T)
    assert changed[0].nonzero().flatten().tolist() == [5, 6, 7, 8, 9]  # image 0: the last five score highest
    assert changed[1].nonzero().flatten().tolist() == [0, 1, 3, 5, 7]  # image 1: 9, 8, 7, 6, 5 ...
    assert torch.equal(seen[0][1], h[1, [0, 1, 3, 5, 7]])  # ... run in the grid's order
    assert torch.equal(y[~changed], h[~changed])  # the others skip the layer unchanged
    assert torch.equal(keep_tokens(h, None, 1.0, run), h + 100.0)  # keeping all: the block itself
    # the score learns from the update it gates (the forward unchanged)
    wg = w.clone().requires_grad_(True)
    out = keep_tokens(h, (wg, torch.zeros(1)), 0.5, lambda x: x * 2.0)
    assert torch.equal(out.detach(), keep_tokens(h, score, 0.5, lambda x: x * 2.0))
    out.sum().backward()
    assert wg.grad is not None and wg.grad.abs().sum() > 0


def test_the_space_searches_token_shares_and_names_what_is_wrong(tmp_path):
    plain = space_of(tmp_path, SPACE)
    assert plain.keeps == (1.0,) and "keep" not in plain.to_dict()  # a space without it: its hash as before
    space = space_of(tmp_path)
    assert space.keeps == (1.0, 0.7, 0.5) and space.to_dict()["keep"] == [1.0, 0.7, 0.5] and space.hash != plain.hash
    # per layer 2 heads x 2 FFN x (2 types x 3 shares + axial x 1); 2 widths; depth 1 or 2; 2 patches, 2 stems
    assert space.size() == 2 * (28 + 28**2) * 2 * 2
    with pytest.raises(SpaceError, match=r"keep: \[0\.7, 0\.5\] is not a list of distinct token shares in \(0, 1\] with "
                                         r"1\.0 among them"):
        space_of(tmp_path, KEEP.replace("[1.0, 0.7, 0.5]", "[0.7, 0.5]"))
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(60):
        s = space.sample(rng)
        m = space.mutate(s, rng, 0.5)
        c = space.crossover(s, m, rng)
        for x in (s, m, c):
            assert x in space  # a 2D layer (axial) always keeps every token
            assert all(v == 1.0 for a, v in zip(x.attention, x.keeps) if a == "axial")
            seen.update(x.keeps)
            assert space.decode(space.encode(x)) == x
            assert VisionSubnet.from_dict(json.loads(x.to_json())) == x
    assert seen == {1.0, 0.7, 0.5}
    assert [n for n in space.feature_names() if "keep" in n] == ["l0.keep", "l1.keep"]
    assert not any("keep" in n for n in plain.feature_names())
    assert space.largest().keep == () and space.smallest().keeps == (0.5,)  # the sandwich's smallest keeps the fewest
    s = VisionSubnet(16, 2, (1, 1), (16, 16), ("softmax", "axial"), 8, 4, "linear", keep=(0.7, 0.5))
    assert space.problems(s) == ["keep[1]: 0.5 with axial, a 2D type: a layer over the token grid keeps every token (1.0)"]
    assert plain.problems(VisionSubnet(16, 1, (1,), (16,), ("softmax",), 8, 4, "linear", keep=(0.7,))) == [
        "keep[0]: 0.7 is not one of 1.0"]
    assert VisionSubnet(16, 1, (1,), (16,), ("softmax",), 8, 4, "linear", keep=(1,)).keep == ()  # every token: as before
    with pytest.raises(SubnetError, match=r"^subnet.keep: has 1 entries but depth is 2$"):
        VisionSubnet(16, 2, (1, 1), (16, 16), ("softmax",) * 2, 8, 4, "linear", keep=(0.5,))
    with pytest.raises(SubnetError, match=r"^subnet.keep\[0\]: 1.5 is not a token share in \(0, 1\]$"):
        VisionSubnet(16, 1, (1,), (16,), ("softmax",), 8, 4, "linear", keep=(1.5,))
    genes = space.genes(s)
    assert genes["l0.keep"] == (0.7, (1.0, 0.7, 0.5)) and "l0.keep" not in plain.genes(plain.largest())


def test_extraction_onnx_with_a_static_top_k_and_the_latency_features(tmp_path, graph_cache):
    import onnx

    from search_spaces import tasks
    from supernet.export import PARITY_TOL
    from tasks.image_classification.export import onnx_parity
    from tasks.image_classification.timing import export_vit_onnx
    from tasks.image_classification.model import SuperViT

    space = space_of(tmp_path)
    supernet = SuperViT(space, generator=torch.Generator().manual_seed(0)).eval()
    x = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    keep = VisionSubnet(24, 2, (2, 1), (32, 16), ("softmax", "linear"), 8, 2, "conv", keep=(0.7, 0.5))  # 16 tokens: 12, 8
    full = VisionSubnet(24, 2, (2, 1), (32, 16), ("softmax", "linear"), 8, 2, "conv")
    with torch.no_grad():
        static = supernet.extract(keep)
        assert (static(x) - supernet(x, keep)).abs().max().item() <= 1e-6
        assert (supernet(x, keep) - supernet(x, full)).abs().max().item() > 1e-4  # it is not the whole grid
    assert sorted(static.scores) == ["0", "1"] and static.num_params() == supernet.num_params(keep)
    assert supernet.num_params(keep) == supernet.num_params(full) + 2 * (24 + 1)
    export_vit_onnx(static, tmp_path / "model.onnx")
    assert onnx_parity(static, tmp_path / "model.onnx") <= PARITY_TOL
    graph = onnx.load(str(tmp_path / "model.onnx")).graph
    consts = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    consts.update({n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t) for n in graph.node if n.op_type == "Constant"})
    topk = [n for n in graph.node if n.op_type == "TopK"]  # per keeping layer the top-k, and the sort back to grid order
    assert len(topk) == 4 and sorted(int(consts[n.input[1]].reshape(-1)[0]) for n in topk if n.input[1] in consts) == [8, 12]
    task, w = tasks.of(space), space.workload()
    f_keep, f_full = task.table_features(space, keep, w), task.table_features(space, full, w)
    assert f_keep["l0.keep"] == 0.7 and f_keep["l1.keep"] == 0.5 and f_full["l0.keep"] == 1.0
    assert f_keep["mlp_flops"] == pytest.approx(f_full["mlp_flops"] * (12 * 32 + 8 * 16) / (16 * 32 + 16 * 16))
    assert f_keep["score_flops"] == 2 * 2 * 16 * 24 and f_full["score_flops"] == 0
    from tasks.image_classification.timing import additive_terms

    a = additive_terms(space, keep, w)
    assert a["keep_layers"] == 2 and a["token_layers"] == pytest.approx((12 + 8) * 24 / 1e6)


def test_train_measure_fit_search_export_and_bundle_with_token_keeping(tmp_path, graph_cache, capsys):
    import os
    import subprocess
    import sys
    import tarfile

    from latency.table import read_timings

    space = space_of(tmp_path)
    idx_folder(tmp_path / "data")
    train = ["--batch-size", "16", "--lr", "3e-3", "--lr-warmup", "3", "--eval-interval", "10", "--eval-batches", "2",
             "--ckpt-interval", "10", "--log-interval", "5", "--val-fraction", "0.25", "-q"]
    assert main(["train-supernet", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "run"), "--data", str(tmp_path / "data"),
                 "--max-steps", "10", *train]) == 0
    ckpt = torch.load(tmp_path / "run" / "final.pt", weights_only=True)
    assert any(k.startswith("scores.") for k in ckpt["model"])  # the token scores train with the supernet
    q = ["--timing-threads", "1", "--timing-warmup", "1", "--repeats", "2", "--rounds", "1", "--min-sample-ms", "1", "-q"]
    assert main(["measure-latency", str(tmp_path / "s.yaml"), "--device", "onnxruntime", "--out", str(tmp_path / "ort.csv"),
                 "--samples", "12", *q]) == 0
    table = read_timings(tmp_path / "ort.csv")
    assert any(r.subnet.keep for r in table.rows)  # subnets keeping fewer tokens were timed
    assert main(["fit-predictor", str(tmp_path / "ort.csv"), "--models", "additive", "--out", str(tmp_path / "pred"),
                 "-q"]) == 0
    assert main(["search", str(tmp_path / "run" / "final.pt"), "--predictor", str(tmp_path / "pred"), "--out",
                 str(tmp_path / "search"), "--budget", "1s", "--population", "4", "--parents", "2", "--mutations", "2",
                 "--crossovers", "1", "--generations", "1", "--val-windows", "2", "--eval-batch-size", "16",
                 "--no-progress", "-q"]) == 0
    keep = VisionSubnet(16, 2, (1, 2), (16, 32), ("linear", "axial"), 8, 2, "linear", keep=(0.5, 1.0))
    (tmp_path / "k.yaml").write_text(keep.to_yaml())
    assert main(["export", str(tmp_path / "run" / "final.pt"), "--subnet", str(tmp_path / "k.yaml"), "--out",
                 str(tmp_path / "model"), "--timing-target", "onnxruntime", *q]) == 0
    card = json.loads((tmp_path / "model" / "model_card.json").read_text())
    assert card["subnet"]["keep"] == [0.5, 1.0] and card["onnx"]["parity_max_abs"] <= 1e-4
    assert card["measured"]["median_ms"] > 0
    # the arm bundle: each subnet's graph (with its top-k) timed by the board's runner
    bundle = tmp_path / "b.tar.gz"
    assert main(["measure-latency", str(tmp_path / "s.yaml"), "--device", "arm", "--bundle", str(bundle), "--samples", "3",
                 "--retest", "0", *q[2:]]) == 0
    with tarfile.open(bundle) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "nas-latency-bundle"
    done = subprocess.run([sys.executable, str(root / "runner.py"), "--threads", "1", "--out", str(tmp_path / "board.csv")],
                          capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr
    timed = read_timings(tmp_path / "board.csv").passes("measure")
    assert space.smallest().key in timed and all(r.median_ms > 0 for r in timed.values())


# --------------------------------------------------------------------------- beside CCT's stem and poolings (issue 51)

CCT_KEEP = KEEP.replace("stem: [linear, conv]", "stem: [linear, conv, cct]").replace(
    "stem_channels: 4", "stem_channels: 4\npool: [mean, seq, cls]").replace("[softmax, linear, axial]", "[softmax, linear]")


def test_a_class_token_runs_every_layer_and_the_share_is_of_the_grid():
    """With ``always`` leading tokens (the class token of ``pool: cls``) a layer runs them first, then its share of
    the grid tokens after them, scored among the grid alone: a class token scoring highest takes no grid token's
    place, and it gets no straight-through factor (its update is the block's)."""
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 1 + 10, 3, generator=g)
    h[:, 0, 1] = 100.0  # the class token would win any top-k it entered
    h[:, 1:, 1] = torch.tensor([[5.0, 9.0, 1.0, 7.0, 0.0, 8.0, 2.0, 6.0, 3.0, 4.0]] * 2)
    score = (torch.tensor([[0.0, 1.0, 0.0]]), torch.zeros(1))
    seen = []

    def run(x):
        seen.append(x.clone())
        return x + 100.0

    y = keep_tokens(h, score, 0.5, run, always=1)
    assert seen[0].shape == (2, 1 + 5, 3)  # the class token and kept(10, 0.5) = 5 grid tokens
    assert torch.equal(seen[0][:, 0], h[:, 0])  # the class token first
    assert torch.equal(seen[0][:, 1:], h[:, [1, 2, 4, 6, 8]])  # grid tokens 0, 1, 3, 5, 7 (scores 5, 9, 7, 8, 6)
    changed = (y != h).any(-1)
    assert changed[:, 0].all() and changed[:, 1:].sum(1).tolist() == [5, 5]
    wg = score[0].clone().requires_grad_(True)
    hg = h.clone().requires_grad_(True)
    out = keep_tokens(hg, (wg, torch.zeros(1)), 0.5, lambda x: x * 2.0, always=1)
    assert torch.equal(out.detach(), keep_tokens(h, score, 0.5, lambda x: x * 2.0, always=1))
    out[:, 0].sum().backward()  # the class token's output alone: its factor is exactly 1, nothing reaches the score
    assert torch.equal(hg.grad[:, 0], torch.full((2, 3), 2.0)) and wg.grad.abs().sum() == 0


def test_token_keeping_beside_the_cct_stem_and_every_pooling(tmp_path):
    """A space of stems linear, conv, cct, poolings mean, seq, cls and shares 1.0, 0.7, 0.5: every draw, mutation and
    crossover round-trips (features, JSON); the elastic model equals its extraction for every stem x pooling with
    shares below 1; a cls model's layers run the class token plus their share of the grid, and the latency terms count
    them so."""
    from tasks.image_classification.model import SuperViT
    from tasks.image_classification.timing import additive_terms, image_terms, layered_terms

    space = space_of(tmp_path, CCT_KEEP)
    assert space.stems == ("linear", "conv", "cct") and space.pools == ("mean", "seq", "cls") and space.keeps == (
        1.0, 0.7, 0.5)  # fmt: skip
    per_layer = 2 * 2 * 2 * 3  # heads x ffn x types x shares
    assert space.size() == 2 * (per_layer + per_layer**2) * 2 * 3 * 3
    names = space.feature_names()
    assert names.index("pool=cls") < names.index("embed_dim") < names.index("l0.keep") and names[-2:] == ["l0.keep", "l1.keep"]
    rng = np.random.default_rng(1)
    drawn = []
    for _ in range(40):
        s = space.sample(rng)
        m = space.mutate(s, rng, 0.5)
        drawn += [s, m, space.crossover(s, m, rng)]
    for x in drawn:
        assert x in space and space.decode(space.encode(x)) == x and VisionSubnet.from_dict(json.loads(x.to_json())) == x
    assert {(x.stem, x.pool) for x in drawn if x.keep} == {(st, p) for st in space.stems for p in space.pools}
    supernet = SuperViT(space, generator=torch.Generator().manual_seed(0)).eval()
    x = torch.rand(3, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    base = VisionSubnet(24, 2, (2, 1), (32, 16), ("softmax", "linear"), 8, 2, "cct", keep=(0.7, 0.5))  # 16 tokens: 12, 8
    for stem in space.stems:
        for pool in space.pools:
            sub = replace(base, stem=stem, pool=pool)
            with torch.no_grad():
                static = supernet.extract(sub)
                assert (static(x) - supernet(x, sub)).abs().max().item() <= 1e-5, sub
                assert (supernet(x, sub) - supernet(x, replace(sub, keep=()))).abs().max().item() > 1e-4, sub
            assert static.num_params() == supernet.num_params(sub)
    cls, mean = replace(base, pool="cls"), replace(base, pool="mean")
    tokens, mlp = [], []
    hooks = [blk.register_forward_hook(lambda m, i, o: tokens.append(i[0].shape[1])) for blk in supernet.blocks]
    try:  # record the tokens each layer's block runs
        for sub in (cls, mean):
            with torch.no_grad():
                supernet(x, sub)
            mlp.append(image_terms(space, sub, 1)["mlp_flops"])
    finally:
        for hook in hooks:
            hook.remove()
    assert tokens == [1 + 12, 1 + 8, 12, 8]
    assert mlp == [4.0 * 24 * ((1 + 12) * 32 + (1 + 8) * 16), 4.0 * 24 * (12 * 32 + 8 * 16)]
    assert additive_terms(space, cls, space.workload())["token_layers"] == pytest.approx((13 + 9) * 24 / 1e6)
    lay = layered_terms(space, cls, space.workload())
    assert lay["model:score"] == 2 * 2 * 16 * 24 and lay["model:keep"] == 16 * 24 * 2  # both layers keep a share
    assert "model:keep" not in layered_terms(parse_space(SPACE, where="v.yaml"), replace(base, stem="conv", keep=()),
                                             space.workload())  # a space without token keeping: its columns as before


def test_a_cct_model_with_a_class_token_and_token_keeping_exports_to_onnx_with_parity(tmp_path, graph_cache):
    from tasks.image_classification.export import onnx_parity
    from tasks.image_classification.model import ViT
    from tasks.image_classification.timing import export_vit_onnx

    space = space_of(tmp_path, CCT_KEEP)
    sub = VisionSubnet(24, 2, (2, 1), (32, 16), ("softmax", "linear"), 8, 2, "cct", "cls", keep=(0.7, 0.5))
    model = ViT(space, sub, generator=torch.Generator().manual_seed(2)).eval()
    export_vit_onnx(model, tmp_path / "m.onnx")
    assert onnx_parity(model, tmp_path / "m.onnx") <= 1e-4

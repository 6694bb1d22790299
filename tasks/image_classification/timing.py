"""Timing the ``image`` workload of image-classification subnets: the task's latency parts.

The timed model is the static :class:`~.model.ViT` of the subnet (seeded weights: timing needs shapes); the reference
timed beside every visit is the space's smallest subnet.  A table row's features are the subnet encoding
(``space.encode``: resolution, patch, tokens, stem, then the one-stack genes), its parameters and the analytic terms of
:func:`image_terms` at the token count ``T = (resolution / patch)^2`` of the subnet (the patch and the resolution set
the sequence length the blocks see, one more with ``pool: cls``; a layer keeping a share of the tokens sees
``ceil(share * T)`` of the grid (and the class token), plus its token score, top-k, gather and scatter: :mod:`.tokens`).
``cpu`` and ``cuda`` run the model in torch on ``batch_size`` random images of the data's size; ``onnxruntime`` runs
its ONNX graph (exported once per architecture; fp32, ``int8-dynamic`` or ``int8-static``, quantized as an export
is); the ``arm`` bundle (and ``ssh://``) carries each subnet's graph without its weights (the board's runner draws
seeded ones) and times it on seeded images of the data's size (:func:`latency.devices.arm.write_bundle`,
:func:`bundle_graphs`).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from latency.timing_core import PIXEL_VALUES
from supernet.shapes import params as shape_params
from search_spaces import UserError

from .space import VisionSpace, VisionSubnet
from .tokens import layer_tokens

def require_device(space: VisionSpace, device: str, precision: str | None = "fp32", for_transfer: bool = False) -> None:
    """Refuse, in one line, a precision or way of sampling that cannot time an image space yet (any registered device
    times it: its models run in torch, in ONNX Runtime and in a bundle; the device's own checks say the rest)."""
    from latency.device import precisions_of

    if precision not in (None, "fp32") and precision not in precisions_of(device):
        raise UserError(f"--precision {precision}: {device} runs fp32 only")
    if for_transfer:
        raise UserError(f"--for-transfer: not for an image-classification space ({space.name}) yet; time uniform samples")


def vision_params(space: VisionSpace, subnet: VisionSubnet) -> int:
    """Parameters of the static ViT (``SuperViT.num_params`` on the meta device)."""
    return shape_params(space, subnet)


def vision_timing_model(space: VisionSpace, subnet: VisionSubnet, *, materialize: bool = True):
    from .model import ViT

    if not materialize:
        with torch.device("meta"):
            return ViT(space, subnet).eval()
    return ViT(space, subnet, generator=torch.Generator().manual_seed(0)).eval()


def image_terms(space: VisionSpace, subnet: VisionSubnet, batch: int) -> dict[str, float]:
    """Analytic forward FLOPs (a multiply-add counts 2) of ``batch`` images, by part: the resize, the stem (its
    convolution; cct's max-pool too), the patch embedding, per layer the projections, the token mixing (the type's own
    count at the layer's tokens: the grid or the share it keeps, plus the class token with ``pool: cls``;
    bidirectional) and the MLP, the head (with the sequence pooling's score), and (in a space with token keeping) the
    token scores."""
    from latency.features import mixing_flops, projection_flops
    from search_spaces import Workload

    from .model import leading, patch_inputs

    b, t, e, hd = batch, subnet.seq_len, subnet.embed_dim, space.head_dim
    r = subnet.resolution
    conv = float(2 * b * r * r * 9 * space.channels * space.stem_channels) if subnet.stem != "linear" else 0.0
    pooled = float(b * space.stem_channels * (r // 2) ** 2 * 9) if subnet.stem == "cct" else 0.0
    out = {"resize_flops": float(b * space.channels * r * r * 8 * (r != space.image_size)),
           "stem_flops": conv + pooled,
           "patch_flops": float(2 * b * subnet.tokens * patch_inputs(space, subnet.stem, subnet.patch) * e),
           "proj_flops": 0.0, "mix_flops": 0.0, "mlp_flops": 0.0,
           "head_flops": float(2 * b * e * space.classes) + (float(2 * b * t * e) if subnet.pool == "seq" else 0.0)}  # fmt: skip
    for layer, n in zip(subnet.layers, layer_tokens(subnet.tokens, subnet.keep, subnet.depth, leading(subnet))):
        out["proj_flops"] += projection_flops(layer.attention_spec, b * n, e, layer.heads, hd)
        out["mix_flops"] += mixing_flops(layer.attention_spec, Workload("prefill", b, n), layer.heads, hd, causal=False)
        out["mlp_flops"] += 4.0 * b * n * e * layer.ffn_dim
    if len(space.keeps) > 1:  # (a space without token keeping: the columns its predictors were fitted on)
        out["score_flops"] = float(sum(2 * b * subnet.tokens * e for v in subnet.keeps if v < 1))
    out["flops"] = sum(v for k, v in out.items() if k.endswith("_flops"))
    return out


def vision_table_features(space: VisionSpace, subnet: VisionSubnet, workload) -> dict[str, float]:
    enc = dict(zip(space.feature_names(), space.encode(subnet).tolist()))
    enc["params"] = float(vision_params(space, subnet))
    enc.update(image_terms(space, subnet, workload.batch_size))
    return enc


def additive_terms(space: VisionSpace, subnet: VisionSubnet, workload) -> dict[str, float]:
    """The additive predictor's columns (it adds the constant): each FLOP term in GFLOPs, per-type mixing terms and
    layer counts (per-layer overheads), tokens x layers (norms, residuals, reshapes)."""
    terms = image_terms(space, subnet, workload.batch_size)
    out = {k: v / 1e9 for k, v in terms.items() if k.endswith("_flops") and k != "mix_flops"}
    from latency.features import mixing_flops
    from search_spaces import Workload

    from .model import leading

    b = workload.batch_size
    for kind in space.attention:
        out[f"layers[{kind}]"] = 0.0
        out[f"mix[{kind}]"] = 0.0
    per_layer = layer_tokens(subnet.tokens, subnet.keep, subnet.depth, leading(subnet))  # (seq_len without keeping)
    for layer, n in zip(subnet.layers, per_layer):
        out[f"layers[{layer.attention}]"] += 1.0
        out[f"mix[{layer.attention}]"] += mixing_flops(layer.attention_spec, Workload("prefill", b, n), layer.heads,
                                                       space.head_dim, False) / 1e9
    out["token_layers"] = float(b * sum(per_layer) * subnet.embed_dim) / 1e6
    out["conv_stem"] = float(subnet.stem != "linear")  # (conv or cct: a convolution over the whole image)
    if len(space.keeps) > 1:  # each keeping layer's top-k, gather and scatter over the whole grid
        out.update(keep_terms(subnet, b, 1e6))
    return out


def keep_terms(subnet: VisionSubnet, batch: int, scale: float = 1.0) -> dict[str, float]:
    """Token keeping's own work (a space that searches it): the layers that keep a share, and the grid elements their
    scores, top-k, gathers and scatters read (over every grid token, whatever the share), divided by ``scale``."""
    keeping = sum(v < 1 for v in subnet.keeps)
    return {"keep_layers": float(keeping), "keep_tokens": float(batch * subnet.tokens * subnet.embed_dim * keeping) / scale}


def layered_terms(space: VisionSpace, subnet: VisionSubnet, workload) -> dict[str, float]:
    """The layer-composed predictor's columns: the model's own terms (``model:*``: resize, stem, patch embedding, the
    tokens' position and norm work, the head; with token keeping, the scores and the kept tokens' selection) and,
    summed along the stack at each layer's tokens (the subnet's ``T``, or the share of them it keeps), each layer's
    :func:`latency.features.layer_terms` (bidirectional)."""
    from latency.features import add_terms, layer_terms, type_columns
    from search_spaces import Workload

    terms = image_terms(space, subnet, workload.batch_size)
    out = {f"model:{k[:-len('_flops')]}": terms[k] for k in ("resize_flops", "stem_flops", "patch_flops", "head_flops")}
    out["model:tokens"] = float(workload.batch_size * subnet.tokens * subnet.embed_dim)
    if len(space.keeps) > 1:
        out["model:score"] = terms["score_flops"]
        out["model:keep"] = keep_terms(subnet, workload.batch_size)["keep_tokens"]
    out.update(type_columns(space.attention))
    for layer, n in zip(subnet.layers, layer_tokens(subnet.tokens, subnet.keep, subnet.depth)):
        add_terms(out, layer_terms(layer.attention_spec, Workload("prefill", workload.batch_size, n), subnet.embed_dim,
                                   layer.heads, space.head_dim, layer.ffn_dim, causal=False))
    return out


def vision_matrix(kind: str, space: VisionSpace, workload, subnets) -> tuple:
    """What predictor ``kind`` reads: the additive terms, the layered terms, or the table's features (a ``transfer``'s
    view: those, then the layered terms as ``cost:*`` columns)."""
    from latency.features import matrix

    if kind == "additive":
        return matrix([additive_terms(space, s, workload) for s in subnets])
    if kind == "layered":
        return matrix([layered_terms(space, s, workload) for s in subnets])
    rows = [vision_table_features(space, s, workload) for s in subnets]
    if kind == "transfer":
        rows = [{**r, **{f"cost:{k}": v for k, v in layered_terms(space, s, workload).items()}} for r, s in zip(rows, subnets)]
    return matrix(rows)


def images(space: VisionSpace, batch: int, seed: int = 0) -> np.ndarray:
    """The timed input: ``batch`` seeded random images of the data's size, float32 in [0, 1]."""
    from latency.timing_core import image_feed  # (as a latency bundle's runner draws them on the board)

    return image_feed(batch, (space.channels, space.image_size, space.image_size), seed)[PIXEL_VALUES]


def image_call(model, workload, device: str = "cpu", runtime: str = "eager"):
    """``call()``: one forward pass of ``model`` over the workload's images (no gradients)."""
    if runtime != "eager":
        raise UserError(f"--runtime {runtime}: an image workload is timed with --runtime eager only so far")
    x = torch.from_numpy(images(model.space, workload.batch_size)).to(device)

    def call():
        with torch.no_grad():
            return model(x)

    return call


# --------------------------------------------------------------------------- ONNX


def vision_key(model) -> str:
    fields = {"space": {k: v for k, v in model.space.to_dict().items() if k not in ("latency", "name")},
              "subnet": model.subnet.to_dict()}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def export_vit_onnx(model, path: Path, opset: int | None = None) -> Path:
    """The static model as one ONNX graph: input ``pixel_values`` (batch, C, H, W) float32 in [0, 1] (the name ONNX
    Runtime's and optimum's image classifiers take), output ``logits`` (batch, classes); the batch axis dynamic."""
    from supernet.onnx_export import DEFAULT_OPSET

    class Flat(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(x)[:, 0]  # (B, classes)

    from supernet.attention import ort_ops
    from supernet.onnx_export import _quiet

    x = torch.from_numpy(images(model.space, 2))  # a batch of 2: the exporter would specialise on 1
    with _quiet():
        program = torch.onnx.export(Flat(model.eval()), (x,), dynamo=True, opset_version=opset or DEFAULT_OPSET,
                                    dynamic_shapes=({0: torch.export.Dim("batch", max=4096)},), input_names=[PIXEL_VALUES],
                                    output_names=["logits"], verbose=False,
                                    custom_translation_table=ort_ops.translation_table())
        program.save(str(path))
    return path


def cached_vit_graph(model) -> Path:
    """The model's ONNX graph with its (seeded) weights, exported once per architecture into the graph cache."""
    from latency.onnx_graphs import graph_dir

    directory = graph_dir()
    path = directory / f"vit-{vision_key(model)}.onnx"
    if not path.exists():
        if any(p.is_meta for p in model.parameters()):
            model = vision_timing_model(model.space, model.subnet)
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            export_vit_onnx(model, Path(tmp) / "g.onnx")
            os.replace(Path(tmp) / "g.onnx", path)
    return path


def bundle_graphs(model) -> tuple[dict, dict]:
    """A latency bundle's entry of ``model``: its graph without the large weights (``tensors``: their layout, for the
    runner's seeded weights) and the image shape it takes (``images``: C, H, W); and the graph file it names."""
    import shutil

    from latency.onnx_graphs import folder_once, graph_dir, strip_weights, write_json

    key = vision_key(model)
    folder = graph_dir() / f"vit-bundle-{key}"
    name = f"vit-{key}.onnx"  # unique: a bundle holds many

    def build(tmp: Path) -> None:
        shutil.copyfile(cached_vit_graph(model), tmp / name)
        write_json(tmp / "layout.json", {"tensors": strip_weights(tmp / name), "subnet": model.subnet.to_dict()})

    layout = folder_once(folder, build)
    space = model.space
    entry = {"graph": f"models/{name}", "tensors": layout["tensors"],
             "images": [space.channels, space.image_size, space.image_size]}  # fmt: skip
    return entry, {name: folder / name}


def vision_ort_runner(model, workload, threads: int | None, provider: str, clock: str, precision: str):
    """The onnxruntime device's runner: the model's graph (quantized at an int8 precision) on the workload's images."""
    import onnxruntime as ort

    from latency.timing_core import ort_runner

    graph = str(cached_vit_graph(model))
    feed = {PIXEL_VALUES: images(model.space, workload.batch_size)}
    tmp = None
    if precision != "fp32":
        from latency.quantize import quantized_copy

        tmp = tempfile.mkdtemp(prefix="nas-vit-q-")
        graph = quantized_copy(graph, tmp, precision, [feed])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
    try:
        session = ort.InferenceSession(graph, options, providers=providers)
    finally:
        if tmp is not None:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return ort_runner(session, feed, clock)

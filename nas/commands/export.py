"""``nas export``: the chosen subnet as a plain PyTorch model and an ONNX graph, parity-checked."""

from __future__ import annotations

import argparse

NAME = "export"
HELP = "extract a subnet from a trained supernet; write safetensors + model card and an ONNX model (parity-checked)"
EXAMPLE = "nas export --supernet runs/tiny/latest.pt --subnet runs/search/best_50ms.yaml --out runs/export"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--supernet", required=True, help="supernet checkpoint written by `nas train-supernet`")
    p.add_argument("--subnet", required=True, help="subnet YAML or JSON (e.g. the best subnet `nas search` wrote)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--format", default="torch,onnx", help="comma-separated: torch (safetensors + card, always written), onnx")
    p.add_argument(
        "--target-ort",
        default=None,
        metavar="VERSION",
        help="ONNX Runtime version that will run the model (default: the installed one); older than 1.23 exports opset 18",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the parity-check inputs")


def run(args: argparse.Namespace) -> int:
    from nas.export import export_subnet, parse_formats
    from search_spaces import Subnet
    from supernet.checkpoint import load_supernet

    formats = parse_formats(args.format)
    supernet, payload = load_supernet(args.supernet)
    subnet = supernet.space.check(Subnet.load(args.subnet))
    card = {"source": {"supernet": str(args.supernet), "step": payload["meta"].get("step"), "space_hash": supernet.space.hash}}
    result = export_subnet(supernet, subnet, args.out, formats=formats, target_ort=args.target_ort, card=card, seed=args.seed)
    print(f"exported {subnet}")
    print(f"  parameters        {result.parameters:,}")
    print(f"  torch             {result.out / 'model.safetensors'}  (load: supernet.load_model({str(result.out)!r}))")
    if result.onnx_path:
        print(f"  onnx              {result.onnx_path}  (opset {result.opset}, {result.attention_nodes} fused Attention nodes)")
        print(f"  parity            max |onnxruntime - torch| = {result.parity:.2e}")
    for note in result.notes:
        print(f"  note: {note}")
    return 0

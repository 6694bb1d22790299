"""The done-when figures of `nas export` (issue 8) for a searched subnet: fused attention node count,
parity, and measured latency under ONNX Runtime vs the predictor's estimate (target: within +-10%).

Trains nothing: give it a trained supernet, a subnet (e.g. `nas search`'s best_<budget>.yaml) and a
predictor fitted on `onnxruntime` timings of the same space.

    python scripts/check_export.py --supernet runs/tiny/latest.pt --subnet runs/search/best_20ms.yaml \
        --predictor runs/lat-ort --out runs/check-export --threads 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--supernet", required=True)
    p.add_argument("--subnet", required=True)
    p.add_argument("--predictor", required=True, help="fitted on onnxruntime timings of the supernet's space")
    p.add_argument("--out", default="runs/check-export")
    p.add_argument("--device", default="onnxruntime")
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (use the predictor's)")
    p.add_argument("--clock", default=None, help="wall or cpu (default: the predictor's clock)")
    p.add_argument("--tolerance", type=float, default=10.0, help="allowed |error| in percent (default 10)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--repeats", type=int, default=60)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--min-sample-ms", type=float, default=30.0)
    args = p.parse_args(argv)

    from latency.device import get_device
    from latency.predictors import load_predictor
    from latency.timing_core import Settings
    from latency.measure import measure_model, predicted_latency, workload_text
    from tasks.stack.export import export_subnet
    from search_spaces import Subnet, UserError
    from supernet import load_model
    from supernet.attention.registry import get as attention_type
    from supernet.checkpoint import load_supernet

    try:
        supernet, _ = load_supernet(args.supernet)
        space = supernet.space
        subnet = space.check(Subnet.load(args.subnet))
        predictor = load_predictor(args.predictor)
        predicted = predicted_latency(predictor, space, subnet, args.predictor)
        fp = predictor.fingerprint or {}
        if fp.get("device") != args.device:
            print(f"note: the predictor was fitted on {fp.get('device')!r}, measuring on {args.device!r}", file=sys.stderr)
        threads = (
            args.threads if args.threads is not None else (fp.get("threads") if isinstance(fp.get("threads"), int) else None)
        )
        clock = args.clock or fp.get("clock")
        device = get_device(args.device, threads=threads, clock=clock)
        result = export_subnet(supernet, subnet, args.out, formats=("onnx",))
        softmax_layers = sum(attention_type(spec).fused_onnx for spec in subnet.attention_specs)
        workload = space.workload(predicted["workload"]["name"])
        settings = Settings(
            warmup=args.warmup, repeats=args.repeats, rounds=args.rounds, min_sample_ms=args.min_sample_ms, max_retries=2
        )
        m = measure_model(device, load_model(result.out), workload, settings, onnx_path=result.onnx_path,
                          predicted_ms=predicted["predicted_ms"], baseline_ms=predictor.reference_ms)
    except UserError as e:
        print(f"check_export: error: {e}", file=sys.stderr)
        return 2

    fused_ok = result.attention_nodes == softmax_layers
    within = abs(m["error_pct"]) <= args.tolerance
    print(f"subnet            {subnet}")
    print(f"fused attention   {result.attention_nodes} ONNX Attention nodes for {softmax_layers} softmax-family layers "
          f"(opset {result.opset}): {'OK' if fused_ok else 'MISMATCH'}")
    print(f"parity            max |onnxruntime - torch| = {result.parity:.2e} (limit 1e-4): OK")
    print(f"latency           measured {m['median_ms']:.3f} ms (IQR {m['iqr_ms']:.3f}, {m['timed']}, {workload_text(workload)}, "
          f"threads {threads or 'default'}, clock {clock or 'wall'})"
          + (f" flags {','.join(m['flags'])}" if m["flags"] else ""))
    print(f"                  predicted {m['predicted_ms']:.3f} ms -> error {m['error_pct']:+.1f}% "
          f"({'within' if within else 'OUTSIDE'} +-{args.tolerance:g}%)")
    return 0 if fused_ok and within else 1


if __name__ == "__main__":
    sys.exit(main())

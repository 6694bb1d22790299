"""Check every attention type's CUDA path against its reference, in fp32 and bf16, forward and gradients.

    python scripts/gpu_check_attention.py                        # on a CUDA machine: parity, compile cache, timings
    python scripts/gpu_check_attention.py --device cpu --lengths 128,300 --dtypes fp32
                                                                 # smoke test of the FlexAttention glue on CPU
                                                                 # (compiled forward only: FlexAttention has no CPU backward)

Parity: the path ``attend`` takes on the device (SDPA for softmax / gqa, compiled FlexAttention
with a cached block mask for the sparse types, chunked prefix sums for the linear family) is
compared with the written-out reference computed in fp32 from the same inputs.  fp32 (TF32
off) must agree to 1e-4 (as on CPU); bf16 to 3e-2 of the output scale and 5e-2 of each
gradient's scale.  Compile cache: a repeated (type, shape) must not compile again, and a new
length must compile a new kernel rather than fall back to the eager one (the flex path raises
if it would).  Timings (CUDA): for each sparse type, FlexAttention against the same pattern as
a dense masked SDPA and against full causal SDPA, forward and forward+backward.

Prints a table, writes ``--out`` (JSON), exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search_spaces import parse_attention  # noqa: E402
from supernet.attention import REGISTRY, PatternType, attend, attend_reference, kv_heads  # noqa: E402
from supernet.attention.patterns import dense_mask  # noqa: E402

SPECS = (
    "softmax,gqa:4,local:64,local:256,dilated:32:4,strided:64,fixed:64,longformer:64:16,bigbird:64:16:2,"
    "linear,relu-linear,cosformer:16384,performer:64,hydra,sima,lsra:7,msla:5,convmod:7"
)
BIDIRECTIONAL_SPECS = (
    "softmax,gqa:4,local:64,dilated:32:4,longformer:64:16,bigbird:64:16:2,linear,relu-linear,cosformer:16384,"
    "performer:64,hydra,sima,msla:5,linformer:256,additive,xca"
)
TOL = {"fp32": (1e-4, 1e-4), "bf16": (3e-2, 5e-2)}  # (output, gradients), relative to max(1, scale)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def device_path(spec, device, causal=True):
    """The function ``attend`` runs on CUDA; on CPU (smoke test) the same CUDA path, run there."""
    return REGISTRY[spec.kind].path("cuda", causal=causal)


def parity(spec, t, dtype_name, device, backward, causal=True, b=2, h=8, d=64, seed=0):
    """Largest error of the device path against the fp32 reference, output and every input's gradient
    (the type's own weights included), relative to max(1, the reference's scale)."""
    g = torch.Generator().manual_seed(seed)
    hk, hv = kv_heads(spec, h)
    base = {"q": torch.randn(b, h, t, d, generator=g), "v": torch.randn(b, hv, t, d, generator=g)}
    if hk:
        base["k"] = torch.randn(b, hk, t, d, generator=g)
    typ = REGISTRY[spec.kind]
    for name, shape in typ.weights(spec, h, d, max_seq_len=t).items():
        weight = torch.empty(shape)
        typ.init_weight(name, weight, g)
        base["w." + name] = weight
    grad_out = torch.randn(b, h, t, d, generator=g).to(device)
    dtype = DTYPES[dtype_name]
    fast_in = {n: x.to(device, dtype).requires_grad_(backward) for n, x in base.items()}
    ref_in = {n: x.to(dtype).to(device, torch.float32).requires_grad_(backward) for n, x in base.items()}  # same rounding

    def call(fn, xs):
        w = {n[2:]: x for n, x in xs.items() if n.startswith("w.")}
        return fn(xs["q"], xs.get("k"), xs["v"], spec, w)

    out = call(device_path(spec, device, causal), fast_in)
    ref = call(lambda q, k, v, s, w: attend_reference(q, k, v, s, w, causal), ref_in)
    tol_out, tol_grad = TOL[dtype_name]
    err_out = (out.float() - ref).abs().max().item() / max(1.0, ref.abs().max().item())
    errs = {"out": err_out}
    ok = err_out <= tol_out
    if backward:
        gf = torch.autograd.grad(out, list(fast_in.values()), grad_out.to(dtype))
        gr = torch.autograd.grad(ref, list(ref_in.values()), grad_out.to(dtype).float())
        for name, a, r in zip(fast_in, gf, gr):
            errs["d" + name] = (a.float() - r).abs().max().item() / max(1.0, r.abs().max().item())
            ok &= errs["d" + name] <= tol_grad
    return ok, errs


def compile_cache_check(device) -> tuple[bool, str]:
    """Same (type, shape) twice: no new graph; a new length: one new graph, no fallback."""
    from torch._dynamo.utils import counters

    spec = parse_attention("local:64")
    flex = device_path(spec, device)
    q = torch.randn(1, 4, 1024, 64, device=device)
    flex(q, q, q, spec, {})
    before = counters["stats"]["unique_graphs"]
    flex(q, q, q, spec, {})
    same = counters["stats"]["unique_graphs"] - before
    q2 = torch.randn(1, 4, 1536, 64, device=device)
    flex(q2, q2, q2, spec, {})
    new = counters["stats"]["unique_graphs"] - before - same
    ok = same == 0 and new >= 1
    return ok, f"repeat shape: {same} new graphs (want 0); new length: {new} new graphs (want >= 1)"


def bench(fn, device, reps=10):
    for _ in range(2):
        fn()
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / reps * 1e3


def timings(specs, lengths, device, dtype, h=12, d=64):
    import torch.nn.functional as F

    rows = []
    for spec in specs:
        if type(REGISTRY[spec.kind]).forward_cuda is not PatternType.forward_cuda:
            continue  # FlexAttention serves the sparse types only
        for t in lengths:
            q, k, v = (torch.randn(1, h, t, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
            mask = dense_mask(REGISTRY[spec.kind].pattern, spec, t, device)
            paths = {
                "flex": lambda: attend(q, k, v, spec),
                "dense-masked-sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                "full-causal-sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            }
            for name, fn in paths.items():
                fwd = bench(lambda: fn().detach(), device)
                fb = bench(lambda: fn().sum().backward(), device)
                rows.append({"type": str(spec), "T": t, "path": name, "fwd_ms": fwd, "fwdbwd_ms": fb})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--types", default=None, help="comma-separated types (default: one of each with the --form)")
    p.add_argument("--form", choices=("causal", "bidirectional", "both"), default="both")
    p.add_argument("--lengths", default="128,1000,4096")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--bench-lengths", default="4096,16384", help="CUDA timings (empty: skip)")
    p.add_argument("--out", default="runs/gpu_check_attention.json")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here (use --device cpu for the forward-only smoke test)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    backward = device.type == "cuda"
    forms = ("causal", "bidirectional") if args.form == "both" else (args.form,)
    cases = [
        (parse_attention(s), form)
        for form in forms
        for s in (args.types or (SPECS if form == "causal" else BIDIRECTIONAL_SPECS)).split(",")
        if form in REGISTRY[parse_attention(s).kind].forms
    ]
    specs = [spec for spec, form in cases if form == "causal"]
    lengths = [int(x) for x in args.lengths.split(",")]
    results, failed = [], 0
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}")
    print(f"{'type':18s} {'form':5s} {'T':>5s} {'dtype':5s} {'path':13s} {'ok':4s}  errors (relative)")
    for spec, form in cases:
        causal = form == "causal"
        path = device_path(spec, device, causal)
        for t in lengths:
            for dt in args.dtypes.split(","):
                start = time.perf_counter()
                try:
                    ok, errs = parity(spec, t, dt, device, backward, causal)
                except Exception as e:  # a path that raises is a failed check, and the others still run
                    ok, errs = False, {}
                    print(f"  {spec} {form} T={t} {dt}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
                failed += not ok
                results.append({"type": str(spec), "form": form, "T": t, "dtype": dt, "path": path.__name__, "ok": ok,
                                **errs, "seconds": time.perf_counter() - start})  # fmt: skip
                err_text = " ".join(f"{k}={v:.1e}" for k, v in errs.items())
                print(f"{str(spec):18s} {form[:5]:5s} {t:5d} {dt:5s} {path.__name__[:13]:13s} {'ok' if ok else 'FAIL':4s}  "
                      f"{err_text}  ({time.perf_counter() - start:.1f} s)", flush=True)  # fmt: skip
    cache_ok, cache_msg = compile_cache_check(device)
    failed += not cache_ok
    print(f"compile cache: {'ok' if cache_ok else 'FAIL'}: {cache_msg}")
    bench_rows = []
    if device.type == "cuda" and args.bench_lengths:
        bench_rows = timings(specs, [int(x) for x in args.bench_lengths.split(",")], device, torch.bfloat16)
        print(f"\n{'type':18s} {'T':>6s} {'path':18s} {'fwd ms':>8s} {'fwd+bwd ms':>11s}   (bf16, B=1, H=12, D=64)")
        for r in bench_rows:
            print(f"{r['type']:18s} {r['T']:6d} {r['path']:18s} {r['fwd_ms']:8.2f} {r['fwdbwd_ms']:11.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "argv": sys.argv,
    }
    out.write_text(json.dumps({"meta": meta, "parity": results, "compile_cache": cache_msg, "timings": bench_rows}, indent=2))
    print(f"{failed} check(s) failed; wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

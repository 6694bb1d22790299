"""Training throughput of the supernet running its largest subnet vs. the extracted static model.

Both train the same architecture on the same batches (forward, backward, AdamW step), timed in
alternating rounds in one process so that a busy machine slows both alike.  Prints tokens/s of
each and the ratio (target: supernet >= 90% of the static model), on CPU and, where available,
on CUDA with bf16 autocast.

    python scripts/bench_supernet.py --space tiny --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from search_spaces import load_space  # noqa: E402
from supernet import SuperTransformer  # noqa: E402
from supernet.train import autocast, param_groups, run_model  # noqa: E402


def trainer(model, subnet, x, y, device):
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-3)

    def step() -> None:
        with autocast(device):
            logits = run_model(model, x, subnet)  # (B, T, V)
        F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def seconds_per_step(step, n: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    for _ in range(n):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t) / n


def bench(space, device: torch.device, batch: int, seq: int, steps: int, rounds: int) -> dict[str, tuple[float, float]]:
    """tokens/s of each model: (median round, best round)."""
    gen = torch.Generator().manual_seed(0)
    supernet = SuperTransformer(space, generator=gen).to(device)
    largest = space.largest()
    static = supernet.extract(largest)
    x = torch.randint(0, space.vocab_size, (batch, seq), generator=gen).to(device)
    y = torch.randint(0, space.vocab_size, (batch, seq), generator=gen).to(device)
    runs = {"supernet": trainer(supernet, largest, x, y, device), "static": trainer(static, None, x, y, device)}
    for step in runs.values():  # burn-in
        seconds_per_step(step, 3, device)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for name, step in runs.items():
            times[name].append(seconds_per_step(step, steps, device))
    tokens = batch * seq
    return {name: (tokens / statistics.median(t), tokens / min(t)) for name, t in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--space", default="tiny")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds; the median round counts")
    p.add_argument("--threads", type=int, help="CPU threads (default: torch's choice)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    space = load_space(args.space)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    print(f"space {space.name}, largest subnet {space.largest()}, batch {args.batch_size} x {args.seq_len}, "
          f"{args.rounds} rounds of {args.steps} steps, torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    print(f"{'device':<11}{'round':<8}{'supernet tok/s':>16}{'static tok/s':>15}{'ratio':>8}")
    ok = True
    for device in devices:
        result = bench(space, device, args.batch_size, args.seq_len, args.steps, args.rounds)
        label = "cpu fp32" if device.type == "cpu" else "cuda bf16"
        for i, which in enumerate(("median", "best")):
            sup, sta = result["supernet"][i], result["static"][i]
            print(f"{label:<11}{which:<8}{sup:>16,.0f}{sta:>15,.0f}{sup / sta:>8.1%}")
        ok &= result["supernet"][0] / result["static"][0] >= 0.9
    if not torch.cuda.is_available():
        print("(no CUDA device here: CPU only)")
    print(f"target supernet >= 90% of static (median rounds): {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

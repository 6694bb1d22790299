"""Training throughput of the supernet against static models of the same subnets.

Two measurements, each timed in alternating rounds in one process so that a busy machine slows both alike, on the
same batches (forward, backward, AdamW step):

* ``largest``: the supernet running its largest subnet against the extracted static model of it;
* ``sandwich`` (issue 56): the type-balanced sandwich as ``nas train-supernet`` runs it (``SandwichObjective``'s
  plans: each step the largest and smallest subnets of one type in turn, then two drawn ones, in-place distillation
  from the largest, one AdamW step over the supernet), a full rotation of the types per round, against training each
  of those subnets as its own static model one step (forward, backward, AdamW): the cost of the supernet per
  subnet-pass, with what the rotation adds (another type's weights and kernels each step) included.

Prints tokens/s per subnet-pass of each and the ratio (target: the supernet at >= 90% of the static models), on CPU
and, where available, on CUDA with bf16 autocast; ``--json FILE`` writes the figures with the machine and load.

    python scripts/bench_supernet.py --space tiny --threads 2
    python scripts/bench_supernet.py --space tiny --threads 2 --only sandwich --json runs/supernet-step.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from search_spaces import load_space  # noqa: E402
from supernet import SuperTransformer  # noqa: E402
from supernet.train import SandwichObjective, autocast, param_groups, run_model  # noqa: E402


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
    return alternate(runs, batch * seq, steps, rounds, device, burn_in=3)


def alternate(runs: dict, tokens: int, steps: int, rounds: int, device: torch.device, burn_in: int) -> dict:
    """``{name: (tokens/s of the median round, of the best round)}`` of ``runs`` (callables of ``tokens`` tokens each),
    after ``burn_in`` calls of each, timed ``steps`` calls a round in ``rounds`` alternating rounds."""
    for run in runs.values():
        seconds_per_step(run, burn_in, device)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            times[name].append(seconds_per_step(run, steps, device))
    return {name: (tokens / statistics.median(t), tokens / min(t)) for name, t in times.items()}


def bench_sandwich(space, device: torch.device, batch: int, seq: int, rounds: int) -> dict[str, tuple[float, float]]:
    """tokens/s per subnet-pass: the supernet's sandwich steps over one rotation of the types against each pass's
    subnet trained as a static model for one step; (median round, best round)."""
    gen = torch.Generator().manual_seed(0)
    supernet = SuperTransformer(space, generator=gen).to(device)
    objective = SandwichObjective(space, seed=0)  # the trainer's defaults: balance "types", 2 drawn subnets, distill 0.5
    plans = [objective.plan(step) for step in range(max(1, len(objective.types)))]
    x = torch.randint(0, space.vocab_size, (batch, seq), generator=gen).to(device)
    y = torch.randint(0, space.vocab_size, (batch, seq), generator=gen).to(device)
    opt = torch.optim.AdamW(param_groups(supernet, 0.1), lr=1e-3)

    def sandwich_step(plan) -> None:
        memo: dict = {}
        for i, (_, subnet) in enumerate(plan):
            with autocast(device):
                logits = run_model(supernet, x, subnet)
            loss, _ = objective.loss(i, logits, y, memo)
            (loss / len(plan)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    statics = [[trainer(supernet.extract(subnet), None, x, y, device) for _, subnet in plan] for plan in plans]

    def run_supernet() -> None:
        for plan in plans:
            sandwich_step(plan)

    def run_static() -> None:
        for steps in statics:
            for step in steps:
                step()

    passes = sum(len(plan) for plan in plans)  # (burn-in: every kernel and allocation of the rotation once)
    return alternate({"supernet": run_supernet, "static": run_static}, batch * seq * passes, 1, rounds, device, burn_in=1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--space", default="tiny")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds; the median round counts")
    p.add_argument("--threads", type=int, help="CPU threads (default: torch's choice)")
    p.add_argument("--only", choices=("largest", "sandwich"), help="one of the two measurements (default both)")
    p.add_argument("--json", type=Path, help="also write the figures (with the machine and load) to this file")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    space = load_space(args.space)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    print(f"space {space.name}, largest subnet {space.largest()}, batch {args.batch_size} x {args.seq_len}, "
          f"{args.rounds} rounds ({args.steps} steps each for largest; one rotation of the types for sandwich), "
          f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, load {os.getloadavg()[0]:.2f}")
    print(f"{'measurement':<12}{'device':<11}{'round':<8}{'supernet tok/s':>16}{'static tok/s':>15}{'ratio':>8}")
    ok, record = True, {"space": space.name, "batch": args.batch_size, "seq_len": args.seq_len, "rounds": args.rounds,
                        "threads": torch.get_num_threads(), "torch": torch.__version__, "host": platform.node(),
                        "cpu": platform.processor() or platform.machine(), "load_before": os.getloadavg(),
                        "results": []}  # fmt: skip
    for kind in [args.only] if args.only else ["largest", "sandwich"]:
        for device in devices:
            if kind == "largest":
                result = bench(space, device, args.batch_size, args.seq_len, args.steps, args.rounds)
            else:
                result = bench_sandwich(space, device, args.batch_size, args.seq_len, args.rounds)
            label = "cpu fp32" if device.type == "cpu" else "cuda bf16"
            for i, which in enumerate(("median", "best")):
                sup, sta = result["supernet"][i], result["static"][i]
                print(f"{kind:<12}{label:<11}{which:<8}{sup:>16,.0f}{sta:>15,.0f}{sup / sta:>8.1%}")
            ratio = result["supernet"][0] / result["static"][0]
            ok &= ratio >= 0.9
            record["results"].append({"measurement": kind, "device": label, "supernet_tokens_s": result["supernet"][0],
                                      "static_tokens_s": result["static"][0], "ratio_median": ratio,
                                      "ratio_best": result["supernet"][1] / result["static"][1]})  # fmt: skip
    if not torch.cuda.is_available():
        print("(no CUDA device here: CPU only)")
    print(f"target supernet >= 90% of static (median rounds): {'met' if ok else 'NOT met'}")
    if args.json:
        record["load_after"] = os.getloadavg()
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

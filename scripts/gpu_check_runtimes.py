"""Each attention type of a space on each CUDA timing runtime, one uniform model per type, each in its own process.

    python scripts/gpu_check_runtimes.py                       # tiny, runtimes cudagraph and compile
    python scripts/gpu_check_runtimes.py --space base --runtimes cudagraph --jobs 4

``nas measure-latency --device cuda --runtime cudagraph|compile`` stops at the first subnet a runtime cannot
serve (a device-side assert loses the process's CUDA context), and a subnet mixes several types. This
builds, per type, the uniform subnet of the space's largest width with that type in every layer, prepares
it on the runtime (which checks the output against eager mode), fills the GPU memory the runner does not
hold (as the next model of a campaign does) and times a few calls, in a subprocess so that one failure
does not hide the others. Prints one line per (type, runtime); exits 1 if any fails.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def one(space_name: str, attention: str, runtime: str) -> str:
    """Prepare and time the uniform model of ``attention`` (in this process); the line to print."""
    import torch

    from latency.devices.cuda import CUDA
    from latency.protocol import timing_model
    from search_spaces import Subnet, UserError, load_space

    space = load_space(space_name)
    depth = min(space.depth)
    subnet = Subnet(max(space.embed_dim), depth, (max(space.heads),) * depth, (max(space.ffn_dim),) * depth,
                    (attention,) * depth)  # fmt: skip
    try:
        run = CUDA(runtime).prepare(timing_model(space, subnet), space.workloads[0])  # the runner alone holds the model
        # as in a campaign, other models come next: memory the runner let go is taken and overwritten
        others = [torch.full((1 << 20,), 3e9, device="cuda") for _ in range(32)]  # noqa: F841
        ms = run(10) / 10 * 1e3
    except UserError as e:
        return f"FAIL  {e}"
    torch.cuda.synchronize()
    return f"ok    {ms:.3f} ms per call"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--space", default="tiny")
    p.add_argument("--runtimes", default="cudagraph,compile")
    p.add_argument("--jobs", type=int, default=4, help="processes at once")
    p.add_argument("--one", nargs=3, metavar=("SPACE", "TYPE", "RUNTIME"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(one(*args.one), flush=True)
        return 0
    from search_spaces import load_space

    space = load_space(args.space)
    cases = [(str(a), r) for r in args.runtimes.split(",") for a in space.attention]

    def run(case):
        a, r = case
        proc = subprocess.run([sys.executable, __file__, "--one", args.space, a, r], capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        lines = proc.stdout.strip().splitlines()
        if proc.returncode or not lines:
            err = proc.stderr.strip().splitlines() or ["no output"]
            # the exception's own line (torch's dynamo errors end with advice on logging, not with what went wrong)
            cause = next((x for x in reversed(err) if "Error" in x or "Exception" in x or "Unsupported" in x), err[-1])
            return f"FAIL  exit {proc.returncode}: {cause[:400]}"
        return lines[-1]

    failed = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        for (a, r), line in zip(cases, pool.map(run, cases)):
            failed += line.startswith("FAIL")
            print(f"{a:18s} {r:10s} {line}", flush=True)
    print(f"{failed} of {len(cases)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""``nas space``: show a search space, its size and the parameter counts of its extremes."""

from __future__ import annotations

import argparse
from .registry import register_command

NAME = "space"
HELP = "show a search space: its choices, number of subnets, parameter counts (and sample subnets)"
EXAMPLE = "nas space search_spaces/base.yaml --samples 2 --seed 0"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("space", help="a search-space YAML file, or the name of a shipped space (tiny, base)")
    p.add_argument("--samples", type=int, default=0, metavar="N", help="also print N uniformly sampled subnets as YAML")
    p.add_argument("--seed", type=int, default=0, help="seed for --samples (default 0)")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from nas.commands.common import emit
    from search_spaces import describe, load_space, tasks
    from supernet.shapes import shape_supernet

    space = load_space(args.space)
    model = shape_supernet(space)  # the task's model on the meta device: shapes only
    print(describe(space))
    doc = {"space": space.name, "hash": space.hash, "task": tasks.of(space).name, "subnets": space.size()}
    for label, subnet in (("largest", space.largest()), ("smallest", space.smallest())):
        print(f"  {label:<13} {model.num_params(subnet):>12,} parameters   {subnet}")
        doc[label] = {"params": model.num_params(subnet), "key": subnet.key, "subnet": subnet.to_dict()}
    if args.samples < 0:
        from search_spaces import UserError

        raise UserError(f"--samples: {args.samples} is negative; give a count >= 0")
    rng = np.random.default_rng(args.seed)
    doc["samples"] = []
    for i in range(args.samples):
        subnet = space.sample(rng)
        print(f"\n# sample {i} (seed {args.seed}), {model.num_params(subnet):,} parameters, key {subnet.key}")
        print(subnet.to_yaml(), end="")
        doc["samples"].append({"params": model.num_params(subnet), "key": subnet.key, "subnet": subnet.to_dict()})
    doc["seed"] = args.seed
    emit(args, doc)
    return 0


register_command(__name__)

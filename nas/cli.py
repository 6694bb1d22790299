"""``nas``: one entry point, one small module per subcommand in :mod:`nas.commands`.

Each subcommand module defines ``NAME``, ``HELP``, ``EXAMPLE``, ``add_arguments(parser)``
and ``run(args) -> int``.  Heavy imports stay inside ``run`` so ``nas --help`` is fast.
A :class:`search_spaces.UserError` becomes its message on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from search_spaces.errors import UserError

from . import __version__

# The subcommands that exist, in the order --help lists them.
COMMANDS = ["demo", "space", "train-supernet", "measure-latency", "fit-predictor", "predict", "search", "export", "finetune", "generate"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nas",
        description="Hardware-aware neural architecture search for Transformers.",
    )
    parser.add_argument("--version", action="version", version=f"nas {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in COMMANDS:
        module = importlib.import_module(f"nas.commands.{name.replace('-', '_')}")
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=module.HELP,
            epilog=f"example:\n  {module.EXAMPLE}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except UserError as e:
        print(f"nas {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"nas {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

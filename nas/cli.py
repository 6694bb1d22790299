"""``nas``: one entry point, one small module per subcommand in :mod:`nas.commands`.

Each subcommand module defines ``NAME``, ``HELP``, ``EXAMPLE``, ``add_arguments(parser)``
and ``run(args) -> int``; a task adds commands of its own the same way
(:attr:`tasks.base.Task.commands`).  Heavy imports stay inside ``run`` so ``nas --help`` is fast.
A :class:`search_spaces.UserError` becomes its message on stderr and exit status 2.

Output: results (tables, summaries, paths written) go to stdout, printed by the command modules.
Notes and warnings go through :mod:`logging` (``logging.getLogger(__name__)`` in every module),
set up here once per command: one line each on stderr, ``nas COMMAND: message``, written through
tqdm so progress bars stay whole.  ``-q`` keeps warnings and errors only (and hides the progress
bars), ``-v`` adds debug detail.  Progress is a redrawn bar on a terminal and one line per interval in a
file or a pipe (:func:`nas.commands.common.progress_bar`); ``--no-progress`` (the long commands) hides it.
With ``--json`` (the commands that print a result) the command's printed lines go to stderr too and stdout gets one
JSON document (:func:`nas.commands.common.emit`).

Every command takes ``--config FILE`` (YAML; flags given override it) and ``--print-config``
(:mod:`nas.commands.config`); the flags' names mean one thing each across the commands, and the old
spellings of one release print which flag to use instead (:mod:`nas.commands.vocabulary`, docs/cli.md).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import sys
from collections.abc import Iterator

from search_spaces.errors import UserError, hide_password
from supernet.progress import progress_off, show_progress  # noqa: F401  (nas.cli.show_progress: the name scripts know)

from . import __version__

def command_modules() -> dict:
    """Every subcommand's module by its name, from the one registry (:data:`nas.commands.COMMANDS`): the generic ones,
    then each registered task's own (``Task.commands``, registered here in registration order), then plugins'."""
    from search_spaces.tasks import tasks

    from .commands.registry import COMMANDS, register_command

    for task in tasks().values():
        for path in getattr(task, "commands", ()):
            module = importlib.import_module(path)
            if module.NAME not in COMMANDS.all():
                register_command(module)
            assert COMMANDS.all()[module.NAME] is module, f"task {task.name}: command {module.NAME!r} exists already"
    return dict(COMMANDS.all())


# The loggers of this project's packages; the handler below is attached to these only, so other
# libraries' logging (Optuna, torch) keeps its own settings.
PACKAGES = ("nas", "latency", "supernet", "search_spaces")


class _StderrHandler(logging.Handler):
    """One line per record on the current ``sys.stderr``, through ``tqdm.write`` (bars are redrawn below it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)


class _Formatter(logging.Formatter):
    def __init__(self, command: str):
        super().__init__()
        self.command = command

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        return hide_password(f"nas {self.command}: {level}{record.getMessage()}")  # a URL's password, wherever it came from


def log_level(verbose: int, quiet: int) -> int:
    """``-q``: warnings and errors only; default: notes (INFO); ``-v``: debug detail."""
    return logging.WARNING if quiet > verbose else logging.DEBUG if verbose > quiet else logging.INFO


@contextlib.contextmanager
def logging_to_stderr(command: str, level: int = logging.INFO) -> Iterator[None]:
    """Route this project's log records to stderr while ``command`` runs, and to nowhere else (a script that runs
    commands in-process under its own root handler would print every note twice); restore the previous set-up
    after (``nas demo`` runs other commands inside its own)."""
    handler = _StderrHandler()
    handler.setFormatter(_Formatter(command))
    saved = []
    for name in PACKAGES:
        logger = logging.getLogger(name)
        ours = [h for h in logger.handlers if isinstance(h, _StderrHandler)]
        saved.append((logger, logger.level, logger.propagate, ours))
        for h in ours:
            logger.removeHandler(h)
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False
    try:
        yield
    finally:
        for logger, old_level, old_propagate, ours in saved:
            logger.removeHandler(handler)
            for h in ours:
                logger.addHandler(h)
            logger.setLevel(old_level)
            logger.propagate = old_propagate


def _output_flags() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    g = common.add_argument_group("output")
    g.add_argument("-v", "--verbose", action="count", default=0, help="more detail in the notes on stderr")
    g.add_argument(
        "-q", "--quiet", action="count", default=0, help="no notes or progress bars on stderr, only warnings and errors"
    )
    c = common.add_argument_group("configuration (docs/cli.md)")
    c.add_argument("--config", metavar="FILE", help="read the flags from this YAML file (keys: the flags' names, e.g. "
                   "max_steps or max-steps; positional arguments by name); flags given on the command line override it")
    c.add_argument("--print-config", action="store_true",
                   help="print the effective flags (the file and the command line merged) as YAML and exit")
    return common


def _progress_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr (a bar on a terminal, one line "
                   "every 30 s in a log file; notes and warnings stay)")


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the result as one JSON document on stdout (what the "
                   "command prints otherwise goes to stderr)")


def build_parser() -> argparse.ArgumentParser:
    from .commands.vocabulary import JSON as JSON_COMMANDS
    from .commands.vocabulary import PROGRESS as PROGRESS_COMMANDS
    from .commands.vocabulary import add_aliases

    parser = argparse.ArgumentParser(  # allow_abbrev=False (here and in every command's): --conf is no --config
        prog="nas",
        description="Hardware-aware neural architecture search for Transformers.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"nas {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    common = _output_flags()
    for name, module in command_modules().items():
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=module.HELP,
            epilog=f"example:\n  {module.EXAMPLE}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            parents=[common],
            allow_abbrev=False,
        )
        module.add_arguments(p)
        if name in PROGRESS_COMMANDS:
            _progress_flag(p)
        if name in JSON_COMMANDS:
            _json_flag(p)
        add_aliases(p, name)
        p.set_defaults(run=module.run)
    return parser


def _command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:  # noqa: SLF001 - the subparsers action holds each command's parser
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return action.choices.get(command)
    return None


def _jsonable(value):
    """A value ``json`` does not know: numpy scalars and arrays as numbers and lists, anything else as its text."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _command_of(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The command named in ``argv`` (its first word that is one), before parsing."""
    names = _command_names(parser)
    return next((a for a in argv if a in names), None)


def _command_names(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            return set(action.choices)
    return set()


def parse(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser and the parsed flags of ``argv``, a ``--config`` file's values under them (UserError: a bad file)."""
    from .commands import config

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:  # shell completion through argcomplete, where it is installed (nas completion prints a script that needs none)
        import argcomplete

        argcomplete.autocomplete(parser)
    except ImportError:
        pass
    command = _command_of(parser, argv)
    if command:
        check_spelled_out(_command_parser(parser, command), argv, command)
    path = config.find_config(argv) if command else None
    lists = {}
    if path is not None:
        lists = config.apply(_command_parser(parser, command), path, config.load(path), command)
    args = parser.parse_args(argv)
    config.override(args, lists)
    if getattr(args, "command", None):
        from .commands.vocabulary import check_required

        check_required(_command_parser(parser, args.command), args)
    return parser, args


def check_spelled_out(parser: argparse.ArgumentParser, argv: list[str], command: str) -> None:
    """Refuse, in one line, a flag written as the start of a longer one (``--conf`` for ``--config``): argparse's
    abbreviations are off (``allow_abbrev=False``), so without this line it would only say "unrecognized"; a flag
    is always written in full, and a new flag never changes what an old command line means."""
    actions = parser._option_string_actions  # noqa: SLF001 - argparse has no public list
    flags = [o for o in actions if o.startswith("--")]
    for arg in argv:
        if arg == "--":
            return
        name = arg.split("=", 1)[0]
        if not name.startswith("--") or name in flags or len(name) < 3:
            continue
        longer = sorted(f for f in flags if f.startswith(name))
        current = [f for f in longer if actions[f].help != argparse.SUPPRESS]  # not the old spellings, where others fit
        longer = current or longer
        if longer:
            raise UserError(f"{name}: nas {command} takes no such flag; flags are written in full: "
                            f"{' or '.join(longer[:4])}{' or ...' if len(longer) > 4 else ''}")


def main(argv: list[str] | None = None) -> int:
    try:
        parser, args = parse(argv)
    except UserError as e:  # a bad --config file
        command = _command_of(build_parser(), list(sys.argv[1:] if argv is None else argv))
        print(hide_password(f"nas {command}: error: {e}"), file=sys.stderr)
        return 2
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    if args.print_config:
        from .commands import config

        sys.stdout.write(config.dump(args.command, config.effective(_command_parser(parser, args.command), args)))
        return 0
    try:
        with logging_to_stderr(args.command, log_level(args.verbose, args.quiet)), progress_off(
                bool(getattr(args, "no_progress", False))):
            from .commands.checks import check_flags

            check_flags(args, _command_parser(parser, args.command))
            if not getattr(args, "json", False):
                return int(args.run(args) or 0)
            with contextlib.redirect_stdout(sys.stderr):  # what the command prints: notes, next to the document
                status = int(args.run(args) or 0)
            if getattr(args, "result", None) is not None:
                print(json.dumps(args.result, indent=1, default=_jsonable))
            return status
    except UserError as e:  # (every error line: a URL's password hidden, wherever the message came from)
        print(hide_password(f"nas {args.command}: error: {e}"), file=sys.stderr)
        return 2
    except Exception as e:  # a file system failure (full disk, read-only, a file where a folder goes): one line, exit 2
        from .commands.checks import io_failure

        line = io_failure(e, args)
        if line is None:
            raise
        print(hide_password(f"nas {args.command}: error: {line}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"nas {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

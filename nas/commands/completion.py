"""``nas completion bash|zsh``: a shell-completion script for ``nas`` (the commands and each command's flags).

The script is written from the parsers themselves, so it knows every command and flag of this version (the old
spellings of :mod:`nas.commands.vocabulary` are left out), and needs nothing installed: ``eval "$(nas completion
bash)"`` in ``~/.bashrc``.  Where ``argcomplete`` is installed (``pip install nas-transformers[completion]``),
``eval "$(register-python-argcomplete nas)"`` completes through the parsers at each press of Tab instead.
"""

from __future__ import annotations

import argparse
from .registry import register_command

NAME = "completion"
HELP = "print a shell-completion script for nas (bash or zsh): eval \"$(nas completion bash)\""
EXAMPLE = 'nas completion bash > ~/.local/share/bash-completion/completions/nas   # or: eval "$(nas completion bash)"'

SHELLS = ("bash", "zsh")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", nargs="?", default="bash", choices=SHELLS, help="the shell (default bash)")


def flags_by_command() -> dict[str, dict[str, tuple[str, ...]]]:
    """``{command: {flag: choices}}`` of the current flags (no old spellings, no hidden ones)."""
    from nas.cli import _command_parser, build_parser

    parser = build_parser()
    out = {}
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name in action.choices:
                p = _command_parser(parser, name)
                out[name] = {o: tuple(map(str, a.choices or ())) for a in p._actions  # noqa: SLF001
                             if a.help != argparse.SUPPRESS for o in a.option_strings if o.startswith("--")}
    return out


def script(shell: str = "bash") -> str:
    """The completion script: commands after ``nas``, a command's flags after ``-``, a flag's choices after it,
    file names elsewhere (each name one completion, spaces and glob characters in it kept: read line by line, not
    split by the shell)."""
    table = flags_by_command()
    cases, choices = [], []
    for name, flags in table.items():
        cases.append(f"        {name}) opts=\"{' '.join(flags)}\" ;;")
        for flag, values in flags.items():
            if values:
                choices.append(f"        {name}:{flag}) COMPREPLY=($(compgen -W \"{' '.join(values)}\" -- \"$cur\")); return ;;")
    body = "\n".join([
        "# nas shell completion (nas completion " + shell + "); generated from the parsers of this version",
        *(["autoload -U +X bashcompinit && bashcompinit"] if shell == "zsh" else []),
        "_nas() {",
        "    local cur prev cmd opts i",
        "    COMPREPLY=()",
        '    cur="${COMP_WORDS[COMP_CWORD]}"',
        '    prev="${COMP_WORDS[COMP_CWORD-1]}"',
        "    cmd=",
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        case "${COMP_WORDS[i]}" in -*) ;; *) cmd="${COMP_WORDS[i]}"; break ;; esac',
        "    done",
        '    if [ -z "$cmd" ]; then',
        f'        COMPREPLY=($(compgen -W "{" ".join(table)} --help --version" -- "$cur")); return',
        "    fi",
        '    case "$cmd:$prev" in',
        *choices,
        "    esac",
        '    case "$cmd" in',
        *cases,
        "        *) opts= ;;",
        "    esac",
        '    if [[ "$cur" == -* ]]; then',
        '        COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
        "    else",  # one name a line, read whole: a name with spaces (or a * or ?) stays one completion
        '        local name',
        '        while IFS= read -r name; do COMPREPLY+=("$name"); done < <(compgen -f -- "$cur")',
        "    fi",
        "}",
        "complete -o filenames -F _nas nas",
    ])
    return body + "\n"


def run(args: argparse.Namespace) -> int:
    import sys

    sys.stdout.write(script(args.shell))
    return 0


register_command(__name__)

"""The flags' vocabulary, declared once: each long flag name, the one thing it means, and the commands that take it.

:data:`VOCABULARY` is the table of the generic flags: ``--name -> Term(dest, meaning, commands)``; a task's and a
device's own flags are declared by their owners (:attr:`tasks.base.Task.flags`, a device class's ``flags``:
:class:`search_spaces.flags.Flag`) and join the table in :func:`terms`, so that adding a task or a device edits no
table here.  A command module adds its flags with
argparse as before; ``tests/test_cli_vocabulary.py`` walks every command's parser and fails when a flag is not in the
table, stores into another field than the table says, or appears in a command the table does not list (a flag
that takes a new meaning somewhere needs a new name, or the table's line must say why the meaning is the same).
``docs/cli.md`` shows the table (:func:`markdown`; the test keeps them equal).

:data:`DEPRECATED` holds the old spellings of one release: ``{command: {old flag: new flag}}``.  :func:`add_aliases`
gives each command its old spellings as hidden flags that store into the new flag's field and print one line on
stderr saying which flag to use instead.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

TRAIN = ("train-supernet", "train-subnet", "finetune")  # the training commands
TIMING = ("measure-latency", "export", "search")  # the commands that time on a timing target
SCORING = ("search", "fit-accuracy", "export")  # held-out scoring of subnets (nas.commands.common.add_scoring_arguments)
PROTOCOL = ("measure-latency", "export")  # the measurement protocol's flags (nas.commands.common.add_protocol_arguments)
ALL = ("*",)  # every command there is (the registry's: nas.commands.COMMANDS)
PROGRESS = ("demo", *TRAIN, "measure-latency", "search", "export", "translate", "data")  # the long commands: progress shown
JSON = ("space", "measure-latency", "fit-predictor", "predict", "search", "fit-accuracy", "export", "doctor")


@dataclass(frozen=True)
class Term:
    dest: str  # the field of the parsed flags (and the key in a --config file)
    meaning: str  # the one thing the name means, in every command that takes it
    commands: tuple[str, ...]  # the commands that take it


VOCABULARY: dict[str, Term] = {
    # ---- every command
    "--help": Term("help", "show the command's help and exit", ALL),
    "--verbose": Term("verbose", "more detail in the notes on stderr", ALL),
    "--quiet": Term("quiet", "warnings and errors only on stderr, no progress bars", ALL),
    "--config": Term("config", "read the flags from a YAML file (keys: the flags' names); flags given override it", ALL),
    "--print-config": Term("print_config", "print the effective flags (file and command line merged) as YAML and exit",
                           ALL),
    "--json": Term("json", "print the result as one JSON document on stdout (notes go to stderr)", JSON),
    # ---- compute: where torch runs the command's own work (training, scoring, inference)
    "--device": Term("device", "where the command runs its models: training, scoring and inference on a torch device "
                     "(auto: a GPU when there is one, cpu, cuda, cuda:N); measure-latency times them on a latency device "
                     "(cpu, cuda, onnxruntime, arm, ssh://user@host)",
                     (*TRAIN, "search", "fit-accuracy", "translate", "measure-latency")),
    "--threads": Term("threads", "CPU threads of torch for the command's own compute (training, scoring): N, or auto "
                      "(the default: the CPUs free here now)",
                      ("demo", *TRAIN)),
    # ---- timing: the timing target (what latency is measured on) and its options
    "--timing-target": Term("timing_target", "timing target: where latency is measured (cpu, cuda, onnxruntime, arm, "
                            "ssh://user@host); search and export time their result on it (measure-latency: the same as "
                            "its --device)", ("export", "search")),
    "--custom-ops": Term("custom_ops", "the attention types' ONNX Runtime custom operators (nas.kernels)", PROTOCOL),
    "--timing-warmup": Term("timing_warmup", "untimed calls before timing (measurement protocol)", PROTOCOL),
    "--repeats": Term("repeats", "timed samples, spread over the rounds (measurement protocol)", PROTOCOL),
    "--rounds": Term("rounds", "interleaved rounds with the reference model (measurement protocol)", PROTOCOL),
    "--min-sample-ms": Term("min_sample_ms", "shortest time one timed sample spans (measurement protocol)", PROTOCOL),
    "--tolerance": Term("tolerance", "reference change across a visit that marks it disturbed (measurement protocol)",
                        PROTOCOL),
    "--max-retries": Term("max_retries", "re-measure passes for disturbed visits (measurement protocol)", PROTOCOL),
    "--combine": Term("combine", "how round medians become one figure: median or min (measurement protocol)", PROTOCOL),
    "--no-drift-correction": Term("no_drift_correction", "do not rescale by the reference model (measurement protocol)",
                                  PROTOCOL),
    "--paired": Term("paired", "a reference sample after every sample (measurement protocol)", PROTOCOL),
    "--workload": Term("workload", "a latency workload of the space, by name (prefill, decode, translate)",
                       ("measure-latency", "predict", "search", "export")),
    "--precision": Term("precision", "the model's numeric precision: fp32, int8-dynamic, int8-static, "
                        "int8-smooth or int8-outlier",
                        ("measure-latency", *SCORING)),
    "--budget": Term("budget", "latency budget(s) with a unit (50ms, 0.05s)", ("search", "export")),
    "--predictor": Term("predictor", "a latency predictor folder (nas fit-predictor --out)",
                        ("predict", "search", "export")),
    # ---- what the commands read and write
    "--out": Term("out", "where the command writes (a folder; measure-latency: the timing table's CSV; report: the page)",
                  ("demo", "train-supernet", "measure-latency", "fit-predictor", "search", "fit-accuracy", "export",
                   "train-subnet", "finetune", "report", "data")),
    "--space": Term("space", "a search space: a YAML file or a shipped name", ("predict", "train-subnet")),
    "--subnet": Term("subnet", "a subnet file (YAML or JSON)", ("export", "translate")),
    "--supernet": Term("supernet", "a supernet checkpoint in a second role (finetune's teacher)", ("finetune",)),
    "--model": Term("model", "a model folder (nas export, finetune) or, for translate, a run or checkpoint",
                    ("finetune", "classify", "generate", "translate")),
    "--data": Term("data", "the data the command reads: a corpus (file, folder, glob) or a labelled CSV",
                   (*TRAIN, "classify", "translate")),
    "--seed": Term("seed", "the seed of the command's random draws (same seed, same result)",
                   ("demo", "space", "train-supernet", "measure-latency", "fit-predictor", "search", "export",
                    "train-subnet", "finetune", "generate", "data")),
    "--format": Term("format", "model files to write, comma-separated: torch, onnx", ("export", "train-subnet",
                                                                                      "finetune")),
    "--target-ort": Term("target_ort", "the ONNX Runtime version that will run model.onnx",
                         ("export", "train-subnet", "finetune")),
    # ---- training (TrainConfig, the sandwich objective, the corpus split)
    "--batch-size": Term("batch_size", "items per forward batch: windows per training step, texts per batch (classify)",
                         (*TRAIN, "classify")),
    "--seq-len": Term("seq_len", "tokens per window", (*TRAIN, *SCORING)),
    "--lr": Term("lr", "peak learning rate", TRAIN),
    "--min-lr": Term("min_lr", "learning rate at the end of the cosine", TRAIN),
    "--lr-warmup": Term("warmup_steps", "linear learning-rate warm-up steps", TRAIN),
    "--weight-decay": Term("weight_decay", "AdamW weight decay", TRAIN),
    "--beta1": Term("beta1", "AdamW beta1", TRAIN),
    "--beta2": Term("beta2", "AdamW beta2", TRAIN),
    "--grad-clip": Term("grad_clip", "gradient-norm clip, 0 = off", TRAIN),
    "--max-steps": Term("max_steps", "training steps in all (the schedule's length)", TRAIN),
    "--max-time": Term("max_time", "training time in all (600, 90s, 10m, 1.5h)", TRAIN),
    "--tokens": Term("tokens", "training token budget (20M, 500k)", ("train-subnet", "finetune")),
    "--eval-interval": Term("eval_interval", "validate every N training steps", TRAIN),
    "--eval-batches": Term("eval_batches", "validation batches per subnet during training", TRAIN),
    "--ckpt-interval": Term("ckpt_interval", "write latest.pt every N steps", TRAIN),
    "--log-interval": Term("log_interval", "write training metrics every N steps", TRAIN),
    "--log": Term("log", "where training metrics go besides OUT/log.jsonl: jsonl (nowhere else) or tensorboard", TRAIN),
    "--random-subnets": Term("n_random", "random subnets per sandwich step", ("train-supernet",)),
    "--distill": Term("distill", "weight of a teacher's soft targets, 0..1", TRAIN),
    "--distill-from": Term("distill_from", "the teacher: supernet:CKPT", ("train-subnet",)),
    "--balance": Term("balance", "how the sandwich's extremes rotate over attention types", ("train-supernet",)),
    "--split": Term("split", "shared or per-family projections (few-shot NAS)", ("train-supernet",)),
    "--split-at": Term("split_at", "fraction of the run after which the families split", ("train-supernet",)),
    "--data-seed": Term("data_seed", "seed of the train/validation split", TRAIN),
    "--val-fraction": Term("val_fraction", "share of the data held out for validation", TRAIN),
    "--compile": Term("compile", "torch.compile the training passes", ("train-supernet",)),
    "--resume": Term("resume", "continue the run in --out exactly", TRAIN),
    "--init": Term("init", "initial weights: scratch, supernet:CKPT or model:DIR", ("train-subnet",)),
    "--task": Term("task", "finetune's other task: classify", ("finetune",)),
    "--text-column": Term("text_column", "the CSV column of the texts", ("finetune", "classify")),
    "--label-column": Term("label_column", "the CSV column of the labels", ("finetune", "classify")),
    "--top": Term("top", "how many classes to print per image, most probable first", ("classify-image",)),
    "--n": Term("n", "examples a data generator writes to the training split", ("data",)),
    "--eval-n": Term("eval_n", "examples a data generator writes to each of the validation and test splits", ("data",)),
    "--recipe": Term("recipe", "the final-training recipe that turns the found subnet into the deployed model: scratch, "
                     "inherit, distill or none (its inherited weights)", ("demo",)),
    # ---- held-out scoring (search, fit-accuracy, export)
    "--val-data": Term("val_data", "held-out data to score on", SCORING),
    "--data-cache": Term("data_cache", "the training run's corpus cache", SCORING),
    "--val-windows": Term("val_windows", "fixed held-out windows per subnet", SCORING),
    "--val-seed": Term("val_seed", "seed of the held-out windows' positions", SCORING),
    "--eval-batch-size": Term("eval_batch_size", "windows per scoring forward pass", ("search", "fit-accuracy")),
    "--no-eval": Term("no_eval", "do not score the model", ("export",)),
    # ---- search
    "--margin": Term("margin", "percent below each budget the search aims by the predictor", ("search",)),
    "--max-params": Term("max_params", "parameter limit (1.5M, 800k)", ("search",)),
    "--strategy": Term("strategy", "evolution, random or nsga2", ("search",)),
    "--population": Term("population", "population size", ("search",)),
    "--parents": Term("parents", "parents per generation", ("search",)),
    "--mutations": Term("mutations", "children by mutation per generation", ("search",)),
    "--crossovers": Term("crossovers", "children by crossover per generation", ("search",)),
    "--generations": Term("generations", "generations in all", ("search",)),
    "--mutate-prob": Term("mutate_prob", "probability that mutation redraws a gene", ("search",)),
    "--selection": Term("selection", "parent selection: top or tournament", ("search",)),
    "--tournament-size": Term("tournament_size", "entrants per tournament", ("search",)),
    "--aging": Term("aging", "regularized evolution", ("search",)),
    "--max-redraws": Term("max_redraws", "redraw rounds for children that break a constraint", ("search",)),
    "--fitness": Term("fitness", "inherited or calibrated:DIR", ("search",)),
    "--no-uniform-seeds": Term("no_uniform_seeds", "no uniform subnets in the first generation", ("search",)),
    "--storage": Term("storage", "Optuna storage URL", ("search",)),
    "--study": Term("study", "Optuna study name", ("search",)),
    "--worker-batch": Term("worker_batch", "subnets a search worker claims and evaluates at once", ("search",)),
    "--no-progress": Term("no_progress", "no progress on stderr (a bar on a terminal, a line every 30 s in a log file); "
                          "notes stay", PROGRESS),
    "--verify-top": Term("verify_top", "candidates per budget timed on the --timing-target", ("search",)),
    "--verify-margin": Term("verify_margin", "percent under the budget a verified candidate's measured latency must be",
                            ("search",)),
    "--hurdles": Term("hurdles", "rounds of progressive dynamic hurdles", ("search",)),
    "--hurdle-candidates": Term("hurdle_candidates", "candidates per budget trained in the hurdles", ("search",)),
    "--hurdle-per-type": Term("hurdle_per_type", "also the best N of each attention type", ("search",)),
    "--hurdle-from": Term("hurdle_from", "hurdle training starts from scratch or inherited weights", ("search",)),
    "--hurdle-batch-size": Term("hurdle_batch_size", "windows per hurdle training step", ("search",)),
    "--hurdle-tokens": Term("hurdle_tokens", "training tokens per hurdle round", ("search",)),
    # ---- latency tables and predictors
    "--bundle": Term("bundle", "the ARM bundle to write (--timing-target arm)", ("measure-latency",)),
    "--samples": Term("samples", "how many subnets to sample", ("measure-latency", "space")),
    "--for-transfer": Term("for_transfer", "sample the subnets that inform a few-shot transfer most",
                           ("measure-latency",)),
    "--retest": Term("retest", "share of subnets timed a second time", ("measure-latency",)),
    "--memory-mb": Term("memory_mb", "weights held at once while timing", ("measure-latency",)),
    "--target": Term("target", "fit-predictor on a plain CSV: the latency column", ("fit-predictor",)),
    "--models": Term("models", "predictor models to compare", ("fit-predictor",)),
    "--from": Term("sources", "few-shot transfer: a source predictor (repeatable)", ("fit-predictor",)),
    "--folds": Term("folds", "cross-validation folds", ("fit-predictor",)),
    "--test-fraction": Term("test_fraction", "held-out share", ("fit-predictor",)),
    # ---- export, generation, translation, the rest
    "--strict": Term("strict", "exit 1 when the measured latency is over --budget", ("export",)),
    "--quick": Term("quick", "the shortened demo", ("demo",)),
    "--no-build": Term("no_build", "do not build the compiled kernels", ("doctor",)),
    "--prompt": Term("prompt", "text to continue", ("generate",)),
    "--max-new-tokens": Term("max_new_tokens", "tokens to generate (bytes for a byte model)", ("generate",)),
    "--temperature": Term("temperature", "sampling temperature", ("generate",)),
    "--top-k": Term("top_k", "sample among the k most likely tokens", ("generate",)),
    "--overflow": Term("overflow", "what generation does once the context is full", ("generate",)),
    "--keep": Term("keep", "tokens a re-prefill keeps", ("generate",)),
    "--beam": Term("beam", "beam width", ("translate",)),
    "--max-bytes": Term("max_bytes", "longest translation in bytes", ("translate",)),
    "--eval": Term("eval", "score a split of the corpus (val, test)", ("translate",)),
    "--limit": Term("limit", "the first N pairs only", ("translate",)),
    "--engine": Term("engine", "what runs translate's model: torch or onnxruntime", ("translate",)),
}

# The old spellings, kept one release: {command: {old: new}}.  Each stores into the new flag's field and says so.
DEPRECATED: dict[str, dict[str, str]] = {
    "measure-latency": {"--threads": "--timing-threads", "--warmup": "--timing-warmup"},
    "export": {"--measure": "--timing-target", "--threads": "--timing-threads", "--warmup": "--timing-warmup",
               "--supernet": "SUPERNET"},
    "search": {"--verify": "--timing-target", "--verify-threads": "--timing-threads", "--verify-clock": "--clock",
               "--batch": "--worker-batch", "--eval-batch": "--eval-batch-size", "--max-tries": "--max-redraws",
               "--hurdle-batch": "--hurdle-batch-size"},
    "fit-accuracy": {"--eval-batch": "--eval-batch-size"},
    "train-supernet": {"--warmup": "--lr-warmup"},
    "train-subnet": {"--warmup": "--lr-warmup"},
    "finetune": {"--warmup": "--lr-warmup"},
    "space": {"--sample": "--samples"},
    "translate": {"--runtime": "--engine"},
}


# Other names of a flag that stay (no warning): {command: {synonym: flag}}.  measure-latency's device is --device (the
# spelling users were given: `nas measure-latency --device D`); --timing-target is what search and export call it.
SYNONYMS: dict[str, dict[str, str]] = {
    "measure-latency": {"--timing-target": "--device"},
}


def say_deprecated(command: str, old: str, new: str) -> None:
    """The one line an old spelling prints (on stderr; once per use)."""
    instead = f"give the supernet checkpoint first, without {old}" if not new.startswith("-") else f"use {new}"
    print(f"nas {command}: warning: {old} is an old spelling (kept for one release): {instead}", file=sys.stderr)


class _Alias(argparse.Action):
    """An old spelling: prints which flag to use instead, then does what the new flag's action does."""

    def __init__(self, option_strings, dest, target: argparse.Action, command: str, new: str, warn: bool = True,
                 **kwargs):
        nargs = None if not target.option_strings and target.nargs == "?" else target.nargs  # a positional's
        shown = f"the same as {new}" if not warn else argparse.SUPPRESS
        super().__init__(option_strings, dest, nargs=nargs, const=target.const, default=argparse.SUPPRESS,
                         type=target.type, choices=target.choices, help=shown, metavar=target.metavar)
        self.target, self.command, self.new, self.warn = target, command, new, warn

    def __call__(self, parser, namespace, values, option_string=None):
        if self.warn:
            say_deprecated(self.command, option_string, self.new)
        self.target(parser, namespace, values, option_string)
        setattr(namespace, REQUIRED_SEEN, getattr(namespace, REQUIRED_SEEN, ()) + (self.target.dest,))


REQUIRED_SEEN = "_nas_required_seen"  # fields a required flag's other spelling has set (checked by check_required)


def check_required(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The required flags that have other spellings (argparse counts only the flag itself): each set by one of its
    names, else argparse's own error naming the flag."""
    seen = set(getattr(args, REQUIRED_SEEN, ()))
    if hasattr(args, REQUIRED_SEEN):
        delattr(args, REQUIRED_SEEN)
    missing = [a.option_strings[-1] for a in getattr(p, "_nas_required", ())
               if a.dest not in seen and getattr(args, a.dest, None) is None]
    if missing:
        p.error(f"the following arguments are required: {', '.join(missing)}")


def add_aliases(p: argparse.ArgumentParser, command: str) -> None:
    """``command``'s old spellings (:data:`DEPRECATED`, hidden, each saying which flag to use) and synonyms
    (:data:`SYNONYMS`, shown, silent) as flags of its parser ``p``.  A required flag with another spelling is checked
    after parsing (:func:`check_required`), so that either spelling satisfies it."""
    actions = {a.dest: a for a in p._actions}  # noqa: SLF001 - argparse has no public list
    by_flag = {o: a for a in p._actions for o in a.option_strings}  # noqa: SLF001
    other = [(old, new, True) for old, new in DEPRECATED.get(command, {}).items()]
    other += [(name, flag, False) for name, flag in SYNONYMS.get(command, {}).items()]
    for old, new, warn in other:
        target = by_flag.get(new) or actions[new.lower()]  # a flag, or a positional by its metavar / field
        if not target.option_strings:  # an optional positional left out must not overwrite what the old flag stored
            p.set_defaults(**{target.dest: target.default})
            target.default = argparse.SUPPRESS
        if target.required and target.option_strings:
            target.required = False
            p._nas_required = [*getattr(p, "_nas_required", ()), target]  # noqa: SLF001
        p.add_argument(old, action=_Alias, dest=target.dest, target=target, command=command, new=new, warn=warn)


def terms() -> dict[str, Term]:
    """Every flag's one meaning: the generic table, then each registered task's flags, then each registered device's
    option flags (``Flag.help`` is the meaning, ``Flag.commands`` the commands)."""
    from latency.device import device_flags
    from search_spaces.tasks import tasks

    out = dict(VOCABULARY)
    owned = [f for t in tasks().values() for f in getattr(t, "flags", ())] + device_flags()
    for f in owned:
        if f.name in out:
            assert out[f.name].dest == f.dest, f"{f.name}: declared twice with other fields"
            out[f.name] = Term(f.dest, out[f.name].meaning, tuple(dict.fromkeys((*out[f.name].commands, *f.commands))))
        else:
            out[f.name] = Term(f.dest, f.help, tuple(f.commands))
    return out


def markdown() -> str:
    """The vocabulary as the Markdown tables docs/cli.md shows (a test keeps the page equal to this)."""
    lines = ["| flag | meaning | commands |", "|---|---|---|"]
    for flag, t in terms().items():
        commands = "every command" if t.commands == ALL else ", ".join(t.commands)
        lines.append(f"| `{flag}` | {t.meaning} | {commands} |")
    lines += ["", "| other name | command | the same as |", "|---|---|---|"]
    for command, table in SYNONYMS.items():
        for name, flag in table.items():
            lines.append(f"| `{name}` | {command} | `{flag}` |")
    lines += ["", "| old spelling | command | use instead |", "|---|---|---|"]
    for command, table in DEPRECATED.items():
        for old, new in table.items():
            lines.append(f"| `{old}` | {command} | `{new}` |")
    return "\n".join(lines)


def problems(parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """What breaks the vocabulary in ``parsers`` (``{command: its parser}``): a long flag not in :data:`VOCABULARY`,
    one that stores into another field than the table says, one in a command the table does not list for it (or
    listed for a command that lacks it), an old spelling that is not hidden or names no flag of the command."""
    out, seen = [], {}
    vocabulary = terms()
    for command, p in parsers.items():
        for action in p._actions:  # noqa: SLF001
            if isinstance(action, _Alias):
                name = action.option_strings[0]
                if action.warn and (action.help != argparse.SUPPRESS or DEPRECATED.get(command, {}).get(name) is None):
                    out.append(f"{command} {name}: an old spelling not in DEPRECATED or not hidden")
                if not action.warn and SYNONYMS.get(command, {}).get(name) is None:
                    out.append(f"{command} {name}: a synonym not in SYNONYMS")
                continue
            for flag in (o for o in action.option_strings if o.startswith("--")):
                term = vocabulary.get(flag)
                if term is None:
                    out.append(f"{command} {flag}: not in the vocabulary (nas/commands/vocabulary.py)")
                    continue
                if action.dest != term.dest:
                    out.append(f"{command} {flag}: stores into {action.dest!r}; the vocabulary says {term.dest!r}")
                seen.setdefault(flag, set()).add(command)
    for flag, term in vocabulary.items():
        have = seen.get(flag, set())
        want = set(parsers) if term.commands == ALL else {c for c in term.commands if c in parsers}
        for command in sorted(have - want):
            out.append(f"{command} {flag}: not listed for {command} in the vocabulary (a new meaning needs a new name)")
        for command in sorted(want - have):
            out.append(f"{command} {flag}: listed in the vocabulary, but {command} takes no {flag}")
    for command, table in DEPRECATED.items():
        if command in parsers:
            flags = {o for a in parsers[command]._actions for o in a.option_strings}  # noqa: SLF001
            for old in table:
                if old not in flags:
                    out.append(f"{command} {old}: an old spelling in DEPRECATED that {command} does not accept")
    return out

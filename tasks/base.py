"""What a task is: one object that knows everything about what is learned.

The layers ask a task (through :mod:`search_spaces.tasks`) where what they do depends on it; everything that
differs between tasks is a method here, grouped by the layer that asks:

* **space** (``search_spaces``): ``name``, ``doc``, ``parse_space`` (a space file's YAML mapping -> its space
  object, whose class owns the *genes*: ``sample``, ``largest`` / ``smallest``, ``mutate``, ``crossover``,
  ``genes`` (the search's trial parameters), ``encode`` / ``decode``, membership), ``describe``, and the latency
  workload kinds the task adds (``workload_kinds``, ``workload_from_record``);
* **model** (``supernet``): ``supernet`` (the elastic model of a space), ``extract`` (the static model of a subnet,
  the same numbers), ``scratch`` (a freshly initialised static model);
* **training** (``supernet.train``, one loop for every task): ``learner`` (what a step's batches, loss,
  distillation and held-out score are, :class:`supernet.task.Learner`), ``prepare_data`` (the task's data:
  a corpus, sentence pairs, a generator), the held-out ``metric``;
* **latency** (``latency``): ``params``, ``timing_model`` and ``timing_reference`` (static models with arbitrary
  weights), ``table_features`` and ``predictor_features`` (a timing table's columns, a predictor's inputs), and
  for a workload kind of its own the timed call (``torch_call``), the ONNX Runtime runner (``ort_runner``)
  and the devices that time it (``timed_on``);
* **search and export** (``nas``): ``fitness`` (a subnet's held-out score with inherited weights), ``export``
  (the artifacts of a chosen subnet and their parity checks);
* **commands** (``nas.commands``): ``flags`` (a command's extra flags for this task, as typed settings), and
  ``commands`` (whole subcommands of its own: ``nas translate``).

Most tasks train one stack of blocks over a sequence (:class:`~tasks.stack.StackTask` gives every method of
that model); a task with a model of another shape (the encoder-decoder) gives its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Flag:
    """An extra flag a task adds to a command: ``--name`` -> ``dest`` (None: not given), checked by the task."""

    name: str
    dest: str
    type: type = str
    metavar: str = "X"
    help: str = ""
    commands: tuple[str, ...] = field(default=())  # the commands that take it


class Task:
    """Base class of the tasks; subclasses override what differs (see the module doc)."""

    name: str = ""
    doc: str = ""
    metric: str = ""  # what the held-out score is: "bits/byte", "nats/target byte", ...
    workload_kinds: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()  # modules of whole subcommands of the task's own (run by `nas`)
    flags: tuple[Flag, ...] = ()

    # ------------------------------------------------------------------ space

    def parse_space(self, data: dict, where: str, source: str) -> Any:
        raise NotImplementedError

    def describe(self, space: Any) -> str:
        raise NotImplementedError

    def workload_from_record(self, data: dict, where: str) -> Any:
        raise NotImplementedError(f"task {self.name} adds no workload kind")

    def options(self, given: dict[str, Any], stored: dict[str, Any] | None = None) -> dict[str, Any]:
        """The task's settings from its flags' values (``dest`` -> value, None = not given) and, on a resumed run,
        what the run stored (its objective's record); a flag that is not the task's, given, is refused in one line."""
        return {}

    def flag_values(self, command: str, values: dict[str, Any]) -> dict[str, Any]:
        """The values of the extra flags of every task given to ``command``; a flag of another task is refused."""
        from search_spaces import UserError

        mine = {f.dest for f in self.flags if command in f.commands}
        for dest, value in values.items():
            if value is not None and dest not in mine:
                raise UserError(f"--{dest.replace('_', '-')}: not for task {self.name}")
        return {k: v for k, v in values.items() if k in mine}

    # ------------------------------------------------------------------ model

    def supernet(self, space: Any, generator: Any = None, **options: Any):
        """The elastic model of ``space`` (``model(*inputs, subnet)``; ``.extract(subnet)``, ``.num_params(subnet)``),
        initialised from ``generator``; ``options``: how a run built it (a one-stack supernet's ``split_families``)."""
        raise NotImplementedError

    def scratch(self, space: Any, subnet: Any, generator: Any = None):
        """A static model of ``subnet`` trained from scratch (``model(*inputs)``), initialised from ``generator``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ training

    learner_options: tuple[str, ...] = ()  # the task's own settings of a run (a masked LM's mask_rate)

    def learner(self, space: Any, seed: int = 0, **options: Any):
        """What a run of ``seed`` learns (:class:`supernet.task.Learner`): its batches, loss, distillation and held-out
        score; ``options``: given values of ``learner_options`` (the others take the task's defaults)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ latency

    def check_timing(self, space: Any, device: str, precision: str | None = "fp32", for_transfer: bool = False) -> None:
        """Refuse, in one line, a device, precision or way of sampling that cannot time this task's models yet."""

    def params(self, space: Any, subnet: Any) -> int:
        """Parameters of the static model of ``subnet`` (the one count, the supernet's)."""
        raise NotImplementedError

    def timing_model(self, space: Any, subnet: Any, *, materialize: bool = True):
        """The static model of ``subnet`` with arbitrary weights (timing needs shapes); on the meta device without
        ``materialize`` (for a device that brings its own weights)."""
        raise NotImplementedError

    def timing_reference(self, space: Any):
        """The fixed model a campaign times beside every visit (drift correction)."""
        raise NotImplementedError

    def table_features(self, space: Any, subnet: Any, workload: Any) -> dict[str, float]:
        """A timing-table row's feature columns."""
        raise NotImplementedError

    def predictor_features(self, kind: str, space: Any, workload: Any, subnets: Any) -> tuple:
        """(matrix, column names) a latency predictor of kind ``kind`` reads of ``subnets``."""
        raise NotImplementedError

    def bundle_models(self, space: Any, seed: int) -> tuple:
        """(subnet -> the static model a latency bundle exports, the reference model)."""
        raise NotImplementedError

    # the workload kinds of the task's own (workload_kinds): how each device runs them

    def torch_call(self, model: Any, workload: Any, device: str = "cpu", runtime: str = "eager"):
        """``call()`` running ``model`` once on ``workload`` in torch (the cpu and cuda devices)."""
        raise NotImplementedError(f"task {self.name} adds no workload kind")

    def ort_runner(self, model: Any, workload: Any, threads: int | None, provider: str, clock: str, precision: str):
        """A runner (``runner(n) -> seconds``) of ``model``'s ONNX graphs on ``workload`` (the onnxruntime device)."""
        raise NotImplementedError(f"task {self.name} adds no workload kind")

    def bundle_graphs(self, model: Any) -> tuple[dict, dict]:
        """(a latency bundle's entry of ``model``, {file name: graph path}) at a workload kind of the task's own."""
        raise NotImplementedError(f"task {self.name} adds no workload kind")

    def __repr__(self) -> str:
        return f"<task {self.name}>"

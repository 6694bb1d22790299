"""What a task is: one object that knows everything about what is learned.

The layers ask a task (through :mod:`search_spaces.tasks`) where what they do depends on it; everything that
differs between tasks is a method here, grouped by the layer that asks:

* **space** (``search_spaces``): ``name``, ``doc``, ``parse_space`` (a space file's YAML mapping -> its space
  object, whose class owns the *genes*: ``sample``, ``largest`` / ``smallest``, ``lightest``, ``mutate``,
  ``crossover``, ``genes`` (a search's trial parameters), ``encode`` / ``decode``, membership), ``describe``, and
  the latency workload kinds the task adds (``workload_kinds``, ``workload_from_record``);
* **model** (``supernet``): ``supernet`` (the elastic model of a space: ``.extract(subnet)``, the static model of
  a subnet, the same numbers), ``scratch`` (a freshly initialised static model);
* **training** (:func:`supernet.train.train`, one loop for every task): ``learner`` (what a step's batches, loss,
  distillation and held-out score are, :class:`supernet.task.Learner`; ``learner_options``, the task's settings
  of a run), the data (``data_keys``, ``data_settings``, ``prepare_data``, ``check_data``, ``data_record``,
  ``describe_*``), ``objective_defaults``, ``token_unit``, ``metric``;
* **latency** (``latency``): ``params``, ``timing_model`` and ``timing_reference`` (static models with arbitrary
  weights), ``table_features`` and ``predictor_features`` (a timing table's columns, a predictor's inputs),
  ``bundle_models``, and for a workload kind of its own the timed call (``torch_call``), the ONNX Runtime runner
  (``ort_runner``), a latency bundle's graphs (``bundle_graphs``) and the devices that time it (``check_timing``);
* **search and export** (``nas``): ``fitness`` (a subnet's held-out score with inherited weights), ``validation``
  (a static model's, for its card), ``export`` (the artifacts of a chosen subnet and their parity checks),
  ``card_facts`` and ``pipeline_tag`` (what the folder's README.md and config.json say, from the card),
  ``specials`` (the token ids of special meaning, named in an exported ONNX file's metadata), ``train_subnet``,
  ``default_workload``, ``unit``;
* **commands** (``nas.commands``): ``flags`` (a command's extra flags for this task: :class:`Flag`), ``refuse``
  (the generic flags it does not take), ``commands`` (whole subcommands of its own: ``nas translate``).

Most tasks train one stack of blocks over a sequence (:class:`~tasks.stack.StackTask` gives every method of
that model); a task with a model of another shape (the encoder-decoder) gives its own.  docs/adding-a-task.md
says how to add one; ``tests/tasks/test_task_in_one_file.py`` declares one in a test file alone.
"""

from __future__ import annotations

from typing import Any

from search_spaces.flags import Flag

__all__ = ["Flag", "Task"]


class Task:
    """Base class of the tasks; subclasses override what differs (see the module doc)."""

    name: str = ""
    doc: str = ""
    metric: str = ""  # what the held-out score is: "bits/byte", "nats/target byte", ...
    workload_kinds: tuple[str, ...] = ()
    commands: tuple[str, ...] = ()  # modules of whole subcommands of the task's own (run by `nas`)
    flags: tuple[Flag, ...] = ()
    subword: bool = False  # whether its spaces may read a subword vocabulary (tokenizer: {bpe: ...}); else bytes only

    # ------------------------------------------------------------------ space

    def parse_space(self, data: dict, where: str, source: str) -> Any:
        raise NotImplementedError

    def describe(self, space: Any) -> str:
        raise NotImplementedError

    def workload_from_record(self, data: dict, where: str) -> Any:
        raise NotImplementedError(f"task {self.name} adds no workload kind")

    # ------------------------------------------------------------------ commands

    def refuse(self, command: str, given: dict[str, Any]) -> None:
        """Refuse, in one line, a generic flag of ``command`` given (``dest`` -> value; None = not given) that this task
        does not take (an encoder-decoder has no ``--seq-len``)."""

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
    objective_defaults: dict[str, Any] = {}  # the sandwich objective's defaults where the task's differ
    data_keys: tuple[str, ...] = ("data", "data_seed")  # the generic data flags it takes; a run records them in its meta
    data_defaults: dict[str, Any] = {"data": None, "data_seed": 0}
    token_unit: str = "tokens"  # what a run's token count counts

    def example_tokens(self, seq_len: int) -> int | None:
        """What one training example counts in ``token_unit`` at ``seq_len``: a token budget (``--hurdle-tokens``) is
        whole steps of batch x this.  None where examples differ in size (a pair's target bytes): a budget is then
        trained to as it is, the last step taking it past."""
        return seq_len

    def data_settings(self, settings: dict[str, Any], flags: dict[str, Any], stored: dict[str, Any] | None) -> dict[str, Any]:
        """A run's data settings (recorded flat in its checkpoints' meta): the generic ones (``settings``, already
        merged with a resumed run's) and the task's own from its ``flags`` given; ``stored``: a resumed run's meta."""
        return settings

    def data_record(self, meta: dict[str, Any], where: str, hint: str = "") -> dict[str, Any]:
        """The data settings a run's checkpoint (its ``meta``) was trained with; one line naming ``where`` when missing."""
        from search_spaces import UserError

        missing = [k for k in self.data_keys if k not in meta]
        if missing:
            raise UserError(f"{where}: the checkpoint does not say which data it was trained on (meta lacks "
                            f"{', '.join(missing)}){hint}")
        return {k: meta[k] for k in self.data_keys}

    def describe_split(self, record: dict[str, Any]) -> str:
        """``validation split of ...``: where held-out data of a run with data settings ``record`` comes from."""
        return f"validation split of {record.get('data') or 'the default data'} (seed {record.get('data_seed')})"

    def prepare_data(self, settings: dict[str, Any], cache_dir: Any, progress: Any = None):
        """The run's data (``.train``, ``.val``, ``.hash``, ``.meta`` with ``corpus`` and ``sizes``, ``.path``), cached in
        ``cache_dir``; ``progress(done, total)`` while it is encoded."""
        raise NotImplementedError

    def check_data(self, data: Any, expected_hash: str, where: str) -> None:
        """Refuse data whose contents differ from what ``where`` (a checkpoint) was trained on."""
        if data.hash != expected_hash:
            from search_spaces import UserError

            raise UserError(f"{where}: trained on data {expected_hash[:16]}, but the data now hashes to {data.hash[:16]}")

    def describe_data(self, data: Any, settings: dict[str, Any]) -> str:
        """One line about the data, for the run's log."""
        return f"data {data.meta.get('corpus')}: hash {data.hash[:16]}"

    def describe_batch(self, config: Any) -> str:
        """``batch 16 x 128 bytes``: what a step trains on, for the run's log."""
        return f"batch {config.batch_size}"

    def learner(self, space: Any, seed: int = 0, **options: Any):
        """What a run of ``seed`` learns (:class:`supernet.task.Learner`): its batches, loss, distillation and held-out
        score; ``options``: given values of ``learner_options`` (the others take the task's defaults)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ search and export

    unit: str = "bpb"  # the held-out score's short unit in tables ("bpb", "nats")
    default_workload: str | None = None  # the workload an export is timed at without --workload (None: the space's first)

    @property
    def specials(self) -> dict[str, int]:
        """The token ids of special meaning (ids after the bytes 0-255, or a byte that stands for something else), name
        -> id, as an exported ONNX file's ``nas.specials`` says them; none by default."""
        return {}

    def train_subnet(self, settings: Any, progress: Any = None):
        """Train one subnet on its own (``settings``: :class:`supernet.runs.SubnetTraining`, its ``options`` the task's
        flags) and write it as a model folder; a result with ``summary()`` (the lines the command prints)."""
        raise NotImplementedError

    def training_data(self, meta: dict[str, Any]) -> dict[str, Any]:
        """The data settings of :class:`supernet.runs.SubnetTraining` (``data``, ``data_seed``, ``val_fraction``,
        ``options``) that train a subnet on a supernet's corpus and split (its checkpoint's ``meta``); empty when the
        checkpoint does not say (then the trainer's defaults)."""
        keys = ("data", "data_seed", "val_fraction")
        return {k: meta[k] for k in keys} if all(k in meta for k in keys) else {}

    def load_trained(self, model_dir: Any, device: Any = "cpu") -> tuple[Any, Any, Any]:
        """(space, subnet, model in eval mode) of a model folder of ``nas train-subnet`` or ``nas export`` (what ``nas
        fit-accuracy`` scores); one line (UserError) where this task's folders are not read that way yet."""
        from search_spaces import UserError

        raise UserError(f"{model_dir}: task {self.name}: its model folders are not read by `nas fit-accuracy` yet")

    def validation(self, model: Any, payload: dict[str, Any], scoring: Any) -> dict[str, Any]:
        """A static model's held-out score as the search scored its subnet (``scoring``:
        :class:`supernet.scoring.FitnessSettings`; ``payload``: the supernet's checkpoint): a card's ``validation``
        (``bits_per_byte``: the score, ``metric``, ``source``, and what it was scored on)."""
        raise NotImplementedError

    def export(self, supernet: Any, payload: dict[str, Any], subnet: Any, settings: Any, predicted: dict | None):
        """Write ``subnet``'s artifacts (``settings``: :class:`supernet.export.ExportSettings`) with their parity checks and a
        card (``predicted``: the predictor's estimate, for it); a :class:`supernet.export.Exported`."""
        raise NotImplementedError

    pipeline_tag: str = "other"  # the Hugging Face pipeline tag of its models ("text-generation", "translation", ...)

    def card_facts(self, space: Any, subnet: Any, card: dict[str, Any]):
        """What the README.md and config.json beside an exported model's card say (:class:`supernet.model_folder.Facts`:
        the pipeline tag, the architecture as ``config.json``, the metrics, the data, how to load it); a generic
        description here (the card's ``validation`` figure), each task says more."""
        from supernet.model_folder import MODEL_TYPE, Facts, Metric

        v = card.get("validation") or {}
        metrics = tuple(Metric(f"validation {self.metric}", self.metric.replace("/", "_per_").replace(" ", "_"),
                               v["bits_per_byte"], self.metric) for _ in (0,) if "bits_per_byte" in v)  # fmt: skip
        return Facts(self.pipeline_tag, {"model_type": MODEL_TYPE, "task": self.name, "subnet": subnet.to_dict()},
                     description=f"A model of task {self.name}", metrics=metrics, subnet=str(subnet))

    def fitness(self, model: Any, payload: dict[str, Any], settings: Any) -> tuple[Any, str]:
        """(fitness, digest of its held-out data): ``fitness(subnets)`` -> each subnet's held-out score with the weights
        of ``model`` (the supernet, loaded as ``payload``); ``.description`` (what a study's identity records),
        ``.summary`` (one line); ``settings``: :class:`supernet.scoring.FitnessSettings`."""
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

"""The files beside an exported model's card that the field's tools read, all written from the card.

* ``README.md``: a Hugging Face model card: YAML front matter (``license``, ``library_name``, ``tags``,
  ``datasets``, ``metrics``, ``pipeline_tag``, ``model-index`` with each metric's value), then prose: what the model
  is, its subnet layer by layer, how it was trained and on what data, its validation figure with the unit, its
  measured and predicted latency with the device, and how to load it;
* ``config.json``: the architecture, Hugging Face style (``model_type``, ``vocab_size``, ``hidden_size``, the layers,
  heads, ffn width and attention type per layer, ``max_position_embeddings``, the task), so that a tool reads the
  model's shape without this package (optimum's ``ORTModelForCausalLM`` loads a causal LM's cached decoder with it);
* ``generation_config.json`` (a causal LM): what ``generate`` defaults to (greedy, the model's context).

What a task's models say differs (the metric, the data, the pipeline, how to load it): the task gives it as
:class:`Facts` (:meth:`tasks.base.Task.card_facts`); :func:`write_folder_files` renders the card with Jinja2, every
value that comes from the card escaped for Markdown (:func:`md`) and the front matter written by a YAML writer.
These files are descriptions: the card's checksums do not list them, loading never reads them, and every write of
the card writes them again (:func:`supernet.artifact.write_card`), so they never disagree with it.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from search_spaces.version import __version__

from .files import atomic_write

README, CONFIG, GENERATION = "README.md", "config.json", "generation_config.json"
FILES = (README, CONFIG, GENERATION)
LIBRARY = "nas-transformers"
MODEL_TYPE = "nas_transformer"  # config.json's model_type of the one-stack Transformer (not a transformers class)
LICENSE = "unknown"  # an export does not know the terms of its data and use: the card says so; set "license" in the card


@dataclass(frozen=True)
class Metric:
    """One figure of the card: ``name`` in words, ``type`` an identifier (``bits_per_byte``, ``accuracy``), its value and
    unit, and the split it was measured on."""

    name: str
    type: str
    value: float
    unit: str
    split: str = "validation"


@dataclass(frozen=True)
class Facts:
    """What a task says of one exported model (from its card): the Hugging Face ``pipeline_tag``, ``config.json``,
    what the model is (``description``: "A byte-level causal language model"), the metrics, the data sets by name, a
    line about the data and one about the training, how to load it (Markdown
    written by the task, code blocks; no card value in it) and a ``generation_config.json`` for a causal LM."""

    pipeline_tag: str
    config: dict[str, Any]
    description: str = "A model"
    metrics: tuple[Metric, ...] = ()
    datasets: tuple[str, ...] = ()
    data: str = ""
    training: str = ""
    usage: str = ""
    generation: dict[str, Any] | None = None
    tags: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    layers: tuple[dict[str, Any], ...] = ()  # the README's table: per layer index, attention, heads, kv, ffn
    subnet: str = ""  # the subnet in one line


# --------------------------------------------------------------------------- config.json of the one-stack Transformer


def uniform(values) -> Any:
    """The one value of a per-layer list, or None where the layers differ."""
    values = list(values)
    return values[0] if values and all(v == values[0] for v in values) else None


def stack_config(space, subnet, task: str, use_cache: bool = False) -> dict[str, Any]:
    """``config.json`` of a one-stack :class:`~supernet.model.Transformer`: Hugging Face's keys (``hidden_size``,
    ``num_hidden_layers``, ``num_attention_heads`` and ``intermediate_size`` where every layer agrees, ``head_dim``,
    ``max_position_embeddings``, ``vocab_size``) and the per-layer lists a searched model needs (heads, key/value
    heads, ffn width and attention type of each layer), and ``mem_len`` for a model with a memory
    (:mod:`supernet.memory`).  ``use_cache``: the folder holds the cached decoder (``step.onnx`` with
    ``past_key_values``)."""
    from .attention import get

    kv = [get(spec).heads(spec, h) for spec, h in zip(subnet.attention_specs, subnet.heads)]
    config = {
        "model_type": MODEL_TYPE,
        "task": task,
        "is_decoder": space.causal,
        "is_encoder_decoder": False,
        "vocab_size": space.vocab_size,
        "hidden_size": subnet.embed_dim,
        "num_hidden_layers": subnet.depth,
        "num_attention_heads": uniform(subnet.heads),
        "num_key_value_heads": uniform(k for k, _ in kv),
        "head_dim": space.head_dim,
        "intermediate_size": uniform(subnet.ffn_dim),
        "num_attention_heads_per_layer": list(subnet.heads),
        "num_key_value_heads_per_layer": [k for k, _ in kv],
        "num_value_heads_per_layer": [v for _, v in kv],
        "intermediate_size_per_layer": list(subnet.ffn_dim),
        "attention_types": list(subnet.attention),
        "max_position_embeddings": space.max_seq_len,
        "position_embedding_type": "rotary" if space.positions == "rope" else "absolute",
        "mem_len": getattr(space, "memory", 0) or None,  # Transformer-XL's name: the previous segment's tokens kept
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "use_cache": use_cache,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "tokenizer": "bytes: the UTF-8 bytes of the text are the ids 0-255",
        "nas_transformers_version": __version__,
        "space": space.name,
        "space_hash": space.hash,
    }
    return {k: v for k, v in config.items() if v is not None or k.endswith("_token_id")}


def optimum_ready(config: dict[str, Any]) -> str | None:
    """Why optimum's ``ORTModelForCausalLM`` cannot run this causal LM's cached decoder, or None where it can.

    optimum builds the first, empty cache of ``num_attention_heads`` heads of ``hidden_size / num_attention_heads``
    values (its generic model types): every layer must keep a key/value cache with that one head count and size."""
    if config.get("mem_len"):
        return (f"it reads on with a memory of the previous segment's last {config['mem_len']} tokens, whose positions its "
                "trimmed cache does not give, so its step.onnx takes the position as an input (no cached decoder)")
    if not config.get("use_cache"):
        return "its layers do not all keep a key/value cache (the decode step keeps other states), so there is no cached decoder"
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if heads is None or kv is None or kv != heads or uniform(config["num_value_heads_per_layer"]) != heads:
        return "its layers keep key/value caches of different head counts; optimum builds the first cache with one"
    if config["hidden_size"] != heads * config["head_dim"]:
        return (f"optimum takes a head's size to be hidden_size / num_attention_heads = {config['hidden_size'] // heads}, "
                f"this model's is {config['head_dim']}")
    return None


# --------------------------------------------------------------------------- README.md


_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]#|!~])")


def md(value: Any) -> str:
    """A value of the card as Markdown text: HTML escaped (``<``, ``>``, ``&``: a renderer passes HTML through),
    Markdown's markup characters backslash-escaped, line breaks as spaces (a value cannot start a heading, a list
    or a table row); numbers as they are."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return str(value)
    text = " ".join(str(value).split())
    return _MD_SPECIAL.sub(r"\\\1", html.escape(text, quote=False))


def _ms(value: Any) -> str:
    return "" if value is None else f"{float(value):.3f} ms"


def _num(value: Any, digits: int = 4) -> str:
    return "" if value is None else f"{float(value):.{digits}f}"


TEMPLATE = """\
# {{ title }}

{{ description }}, found by hardware-aware neural architecture search with nas-transformers: a subnet of the \
`{{ space }}` search space (task `{{ task }}`), {{ parameters | int_sep }} parameters, exported with its weights \
(`model.safetensors`){% for f in formats %}, {{ f }}{% endfor %}.

## The subnet

{{ subnet_line | code }}

| layer | attention | heads | key / value heads | ffn width |
|---|---|---|---|---|
{% for row in layers -%}
| {{ row.index }} | {{ row.attention | code }} | {{ row.heads }} | {{ row.kv }} | {{ row.ffn }} |
{% endfor %}
The whole architecture, for tools: `config.json`; as this toolkit reads it: `subnet.yaml` and `model_card.json` (the \
space, the subnet, every measurement and the checksum of every file).

## Training and data

{% if data %}{{ data }}
{% endif %}{% if training %}
{{ training }}
{% endif %}
## Evaluation

{% if metrics -%}
| metric | value | unit | split |
|---|---|---|---|
{% for m in metrics -%}
| {{ m.name }} | {{ m.value | num }} | {{ m.unit }} | {{ m.split }} |
{% endfor %}{% else -%}
Not scored at export (`--no-eval`).
{% endif %}
## Latency

{% if measured -%}
Measured: **{{ measured.median_ms | ms }}** (interquartile range {{ measured.iqr_ms | ms }}) on `{{ measured.device }}` \
({{ measured.cpu }}{% if measured.threads %}, {{ measured.threads }} threads{% endif %}), {{ measured.workload }}, \
timing `{{ measured.timed }}`{% if measured.flags %} (flags: {{ measured.flags }}){% endif %}.
{% if measured.budget_ms is not none %}Budget {{ measured.budget_ms | ms }}: {{ "over" if measured.over_budget else "within" }}.
{% endif %}{% else -%}
Not measured at export (`nas export --timing-target DEVICE` measures it).
{% endif %}{% if predicted %}
{% endif %}{% if predicted -%}
Predicted: {{ predicted.predicted_ms | ms }} by the `{{ predicted.model }}` latency predictor `{{ predicted.name }}` \
({{ predicted.workload }}, device `{{ predicted.device }}`{% if predicted.cpu %}, {{ predicted.cpu }}{% endif %})\
{% if predicted.error_pct is not none %}; measured - predicted = {{ predicted.error_pct | pct }} of the prediction{% endif %}.
{% endif %}
## How to use it

{{ usage }}
{% if notes %}
## Notes

{% for n in notes -%}
- {{ n }}
{% endfor %}{% endif %}
## Reproduce

- nas-transformers {{ version }}; space `{{ space }}` (hash `{{ space_hash }}`); subnet key `{{ key }}`.
{% if source %}- {{ source }}
{% endif %}- Files (sha256): {% for name, digest in files %}`{{ name }}` `{{ digest }}`\
{% if not loop.last %}, {% endif %}{% endfor %}.
- Licence: {% if license == "unknown" %}not stated by the export (`license: unknown`): the weights derive from the \
training data, whose terms apply; state yours in the front matter before you publish the model.\
{% else %}`{{ license }}`.{% endif %}
"""


def _environment():
    import jinja2

    env = jinja2.Environment(finalize=md, autoescape=False, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters.update(num=_num, ms=_ms, int_sep=lambda v: f"{int(v):,}", pct=lambda v: f"{float(v):+.1f}%", code=code)
    return env


def code(value: Any) -> str:
    """A card value as a Markdown code span (shown as it is: no markup inside one); backticks and line breaks out."""
    return _Trusted("`" + " ".join(str(value).replace("`", "'").split()) + "`")


class _Trusted(str):
    """Markdown the task wrote (its usage section), passed through as it is."""


def _finalize_trusted(env):
    base = env.finalize

    def finalize(value: Any) -> str:
        return str(value) if isinstance(value, _Trusted) else base(value)

    env.finalize = finalize
    return env


def front_matter(card: dict[str, Any], facts: Facts, name: str) -> dict[str, Any]:
    """The README's YAML front matter as Hugging Face model cards have it (``model-index`` carries the values)."""
    results = [{"task": {"type": facts.pipeline_tag},
                "dataset": {"name": facts.datasets[0] if facts.datasets else "held-out data", "type": "custom",
                            "split": m.split},
                "metrics": [{"type": m.type, "value": float(m.value), "name": f"{m.name} ({m.unit})"}]}
               for m in facts.metrics]  # fmt: skip
    meta = {
        "license": card.get("license", LICENSE),
        "library_name": LIBRARY,
        "pipeline_tag": facts.pipeline_tag,
        "tags": list(dict.fromkeys([LIBRARY, "nas", "neural-architecture-search", "hardware-aware", *facts.tags,
                                    *(["onnx"] if any(f.endswith(".onnx") for f in card.get("files", {})) else []),
                                    "safetensors", card["space"].get("task", "")])),  # fmt: skip
        "datasets": list(facts.datasets),
        "metrics": list(dict.fromkeys(m.type for m in facts.metrics)),
        "model-index": [{"name": name, "results": results}] if results else [],
    }
    return {k: v for k, v in meta.items() if v not in ([], "", None)}


def _latency(card: dict[str, Any]) -> tuple[dict | None, dict | None]:
    from search_spaces import Workload

    def words(record) -> str:
        try:
            w = Workload.from_record(record, "the card's workload")
        except Exception:  # noqa: BLE001 - a workload of a task's own kind: say its name
            return str(record.get("name", "?"))
        return f"{w.name} {w.label.split(':', 1)[1]}"

    m, p = card.get("measured"), card.get("latency")
    measured = predicted = None
    if m:
        d = m.get("device", {})
        measured = {"median_ms": m.get("median_ms"), "iqr_ms": m.get("iqr_ms"), "device": d.get("device", "?"),
                    "cpu": d.get("cpu_model", d.get("gpu", "")), "threads": d.get("threads"), "timed": m.get("timed"),
                    "workload": words(m.get("workload", {})), "flags": ", ".join(m.get("flags") or []),
                    "budget_ms": m.get("budget_ms"), "over_budget": m.get("over_budget")}  # fmt: skip
    if p:
        d, source = p.get("device", {}), p.get("predictor")
        predicted = {"predicted_ms": p.get("predicted_ms"), "model": p.get("model"),
                     "name": source.get("name") if isinstance(source, dict) else "",
                     "workload": words(p.get("workload", {})), "device": d.get("device", "?"), "cpu": d.get("cpu_model"),
                     "error_pct": (m or {}).get("error_pct")}  # fmt: skip
    return measured, predicted


def render_readme(card: dict[str, Any], facts: Facts) -> str:
    """README.md of a model folder: the front matter, then the prose of :data:`TEMPLATE` (card values escaped)."""
    space = card["space"]
    name = f"{space.get('name', 'model')}-{card.get('subnet_key', '')}".rstrip("-")
    measured, predicted = _latency(card)
    files = sorted((card.get("files") or {}).items())
    formats = [f"`{n}`" for n in ("model.pt2", "model.onnx", "step.onnx", "encoder.onnx", "decoder_step.onnx")
               if n in dict(files)] + [f"`{n}`" for n, _ in files if ".int8" in n]  # fmt: skip
    source = card.get("source") or {}
    supernet = source.get("supernet") if isinstance(source, dict) else None
    source_line = ""
    if isinstance(supernet, dict):
        source_line = (f"Weights inherited from the supernet checkpoint {supernet.get('name')} (step {source.get('step')}, "
                       f"sha256 {supernet.get('sha256')}).")
    env = _finalize_trusted(_environment())
    text = env.from_string(TEMPLATE).render(
        title=name, task=space.get("task", ""), description=facts.description, space=space.get("name"),
        parameters=card.get("parameters", 0), formats=[_Trusted(f) for f in formats], subnet_line=facts.subnet,
        layers=facts.layers, data=facts.data, training=facts.training, metrics=facts.metrics, measured=measured,
        predicted=predicted, usage=_Trusted(facts.usage), notes=facts.notes, version=__version__,
        space_hash=card.get("space_hash", ""), key=card.get("subnet_key", ""), source=source_line,
        files=files, license=card.get("license", LICENSE))  # fmt: skip
    meta = yaml.safe_dump(front_matter(card, facts, name), sort_keys=False, allow_unicode=True)
    return f"---\n{meta}---\n\n{text}"


def write_folder_files(out: str | Path, card: dict[str, Any], facts: Facts) -> list[Path]:
    """Write ``README.md``, ``config.json`` and (a causal LM) ``generation_config.json`` into ``out``; return their
    paths.  A ``generation_config.json`` of an earlier export is removed where this model has none."""
    out = Path(out)
    written = [atomic_write(out / README, render_readme(card, facts)),
               atomic_write(out / CONFIG, json.dumps(facts.config, indent=2) + "\n")]  # fmt: skip
    if facts.generation is not None:
        written.append(atomic_write(out / GENERATION, json.dumps(facts.generation, indent=2) + "\n"))
    else:
        (out / GENERATION).unlink(missing_ok=True)
    return written


def stack_layers(space, subnet) -> list[dict[str, Any]]:
    """The README's table rows of a one-stack subnet: per layer its attention, heads, key/value heads, ffn width."""
    from .attention import get

    rows = []
    for i, (a, spec, h, f) in enumerate(zip(subnet.attention, subnet.attention_specs, subnet.heads, subnet.ffn_dim)):
        k, v = get(spec).heads(spec, h)
        rows.append({"index": i, "attention": a, "heads": h, "kv": f"{k} / {v}" if k else f"none / {v}", "ffn": f})
    return rows


__all__ = ["CONFIG", "FILES", "Facts", "GENERATION", "LICENSE", "Metric", "README", "md", "optimum_ready", "render_readme",
           "stack_config", "stack_layers", "write_folder_files"]

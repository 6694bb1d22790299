"""What the README.md and config.json of a one-stack model's folder say (:meth:`tasks.base.Task.card_facts` of the
causal LM, the masked LM and the sequence classifier): from the card's validation, data, training and files.

How to load it: this toolkit (``supernet.load_model``, ``nas generate``), ONNX Runtime on ``model.onnx``
(``input_ids`` -> ``logits``) and, for a causal LM whose layers all keep one key/value cache shape, optimum's
``ORTModelForCausalLM`` on the cached decoder ``step.onnx`` (:func:`supernet.model_folder.optimum_ready` says why
not where it cannot).
"""

from __future__ import annotations

from typing import Any

from supernet.model_folder import Facts, Metric, optimum_ready, stack_config, stack_layers

STEP_FORM = "cached decoder"  # supernet.export.export_step's record of a step graph with past_key_values

DESCRIPTION = {"text-generation": "A byte-level causal language model (decoder-only Transformer)",
               "fill-mask": "A byte-level masked language model (bidirectional Transformer encoder)",
               "text-classification": "A sequence classifier (bidirectional Transformer encoder, the class at [CLS])"}


def metric_type(metric: str) -> str:
    """``bits/byte`` -> ``bits_per_byte``: a metric's identifier in the front matter."""
    return metric.replace("/", "_per_").replace(" ", "_")


def stack_metrics(card: dict[str, Any], metric: str) -> tuple[Metric, ...]:
    """The card's figures: the validation score (and accuracy, a classifier's), the INT8 model's where quantized."""
    v = card.get("validation") or {}
    unit = v.get("metric", metric)
    out = []
    if "bits_per_byte" in v:
        out.append(Metric(f"validation {unit}", metric_type(unit), float(v["bits_per_byte"]), unit))
    if "accuracy" in v:
        out.append(Metric("validation accuracy", "accuracy", float(v["accuracy"]), "fraction correct"))
    q = (card.get("quantized") or {}).get("bits_per_byte") or {}
    if "int8_onnxruntime" in q:
        out.append(Metric(f"validation {unit}, {card['quantized']['file']} in ONNX Runtime", metric_type(unit),
                          float(q["int8_onnxruntime"]), unit))  # fmt: skip
    return tuple(out)


def data_words(card: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    """(a line about the training data, the data sets by name) from the card's ``data`` (an export: the supernet's
    corpus) or ``training`` (a model trained on its own)."""
    d = card.get("data") or {}
    t = card.get("training") or {}
    name = d.get("name") or t.get("corpus") or d.get("corpus")
    digest = d.get("hash") or t.get("corpus_hash")
    if not name:
        return "The training data is not recorded in the card (a checkpoint that does not say).", ()
    line = f"Trained on {name}" + (f" (corpus hash {digest})" if digest else "") + "."
    return line, (str(name),)


def training_words(card: dict[str, Any]) -> str:
    """How the weights came to be, in one paragraph."""
    t = card.get("training")
    if t:
        parts = [f"{t.get('steps', '?'):,} steps" if isinstance(t.get("steps"), int) else None,
                 f"{t['tokens']:,} tokens" if isinstance(t.get("tokens"), int) else None,
                 f"{t['seconds']:g} s" if isinstance(t.get("seconds"), (int, float)) else None,
                 f"seed {t['seed']}" if t.get("seed") is not None else None]  # fmt: skip
        return "Trained on its own (`nas train-subnet` / `nas finetune`): " + ", ".join(p for p in parts if p) + "."
    src = card.get("source") or {}
    step = src.get("step")
    return ("Weights inherited from the weight-shared supernet (trained with the sandwich rule and in-place distillation), "
            f"not retrained{f'; the supernet at step {step}' if step is not None else ''}.")


CAUSAL_USAGE = '''With this toolkit (`pip install nas-transformers`), in this folder:

```bash
nas generate --model . --prompt "def main(" --max-new-tokens 200 --temperature 0
```

```python
from supernet import load_model
from supernet.generate import generate

model = load_model(".")  # checks the card's checksums; safetensors: loading runs no code
print(generate(model, b"def main(", 200, temperature=0).decode("utf-8", "replace"))
```

With ONNX Runtime alone (the ids are the UTF-8 bytes of the text; `model.onnx` takes no attention mask):

```python
import numpy as np
import onnxruntime as ort

session = ort.InferenceSession("model.onnx")
ids = np.array([list("def main(".encode())], dtype=np.int64)  # (batch, sequence)
logits = session.run(["logits"], {"input_ids": ids})[0]  # (batch, sequence, vocab)
```
'''

OPTIMUM_USAGE = '''With optimum (`pip install optimum-onnx`): `step.onnx` is the cached decoder (`input_ids`,
`past_key_values.{i}.key` / `.value` in; `logits`, `present.{i}.key` / `.value` out). `config.json` names this
toolkit's model type, which transformers does not know: pass it as a plain `PretrainedConfig`:

```python
import torch
from optimum.onnxruntime import ORTModelForCausalLM
from transformers import PretrainedConfig

model = ORTModelForCausalLM.from_pretrained(".", config=PretrainedConfig.from_pretrained("."), file_name="step.onnx")
ids = torch.tensor([list("def main(".encode())])
out = model.generate(ids, max_new_tokens=50, do_sample=False)
print(bytes(out[0].tolist()).decode("utf-8", "replace"))
```
'''

ENCODER_USAGE = '''With this toolkit (`pip install nas-transformers`), in this folder:

```python
from supernet import load_model

model = load_model(".")  # checks the card's checksums; safetensors: loading runs no code
```

With ONNX Runtime alone (`model.onnx`: `input_ids` (batch, sequence) int64 -> `logits` (batch, sequence, vocab);
no attention mask: a batch is rows of one length):

```python
import numpy as np
import onnxruntime as ort

session = ort.InferenceSession("model.onnx")
logits = session.run(["logits"], {"input_ids": np.array([list(b"some text")], dtype=np.int64)})[0]
```
'''


def stack_facts(task, space, subnet, card: dict[str, Any]) -> Facts:
    """The Facts of a one-stack model's folder (``task``: its :class:`~tasks.stack.StackTask`)."""
    step = card.get("decode_step") or {}
    config = stack_config(space, subnet, task.name, use_cache=step.get("form") == STEP_FORM)
    data, datasets = data_words(card)
    notes = []
    if space.causal:
        usage = CAUSAL_USAGE
        why = optimum_ready(config)
        if why is None and "step.onnx" in (card.get("files") or {}):
            usage += "\n" + OPTIMUM_USAGE
        elif why is not None:
            notes.append(f"optimum's ORTModelForCausalLM does not run this model with a key/value cache: {why}.")
        generation = {"do_sample": False, "max_length": space.max_seq_len, "bos_token_id": None, "eos_token_id": None,
                      "pad_token_id": None, "use_cache": config["use_cache"]}  # fmt: skip
    else:
        usage, generation = ENCODER_USAGE, None
    specials = getattr(task, "specials", {})
    if specials:
        notes.append("Ids of special meaning: " + ", ".join(f"{k} = {v}" for k, v in sorted(specials.items())) + ".")
    tokens = (card.get("validation") or {}).get("tokens")
    if isinstance(tokens, str):
        notes.append(f"Input ids: {tokens}.")
    return Facts(task.pipeline_tag, config, DESCRIPTION.get(task.pipeline_tag, f"A model of task {task.name}"),
                 stack_metrics(card, task.metric), datasets, data, training_words(card), usage, generation,
                 tags=(task.pipeline_tag, "byte-level"), notes=tuple(notes), layers=tuple(stack_layers(space, subnet)),
                 subnet=str(subnet))  # fmt: skip

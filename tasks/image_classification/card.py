"""What the README.md and config.json of an exported image classifier say (:meth:`tasks.base.Task.card_facts` of the
image-classification task): the ViT's shape in the keys of Hugging Face's ViT (``image_size``, ``patch_size``,
``num_channels``, ``hidden_size``, ``id2label``) plus the searched per-layer lists, the validation and test accuracy,
the data, and how to run it.
"""

from __future__ import annotations

from typing import Any

from search_spaces.version import __version__
from supernet.model_folder import MODEL_TYPE, Facts, Metric, stack_config, stack_layers

USAGE = '''With this toolkit (`pip install nas-transformers`), in this folder:

```bash
nas classify-image --model . shirt.png --top 3
```

With ONNX Runtime alone: `model.onnx` takes `pixel_values` (batch, channels, height, width) float32 in [0, 1] (the
model normalises inside) and returns `logits` (batch, classes); `config.json`'s `id2label` names the classes.

```python
import numpy as np
import onnxruntime as ort

session = ort.InferenceSession("model.onnx")
pixels = np.zeros((1, 1, 28, 28), dtype=np.float32)  # your images, scaled to [0, 1]
logits = session.run(["logits"], {"pixel_values": pixels})[0]
```
'''


def vision_config(space, subnet, classes: list[str]) -> dict[str, Any]:
    """``config.json`` of a static ViT: the one-stack keys (:func:`supernet.model_folder.stack_config`) and the image's."""
    stack = stack_config(space, subnet.stack(), space.task)
    for key in ("is_decoder", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "tokenizer", "tie_word_embeddings",
                "vocab_size", "max_position_embeddings", "position_embedding_type"):
        stack.pop(key, None)
    return {**stack, "model_type": f"{MODEL_TYPE}_vit", "image_size": space.image_size, "num_channels": space.channels,
            "resolution": subnet.resolution, "patch_size": subnet.patch, "stem": subnet.stem,
            "num_labels": space.classes, "id2label": {str(i): c for i, c in enumerate(classes)},
            "label2id": {c: i for i, c in enumerate(classes)}, "nas_transformers_version": __version__}  # fmt: skip


def vision_facts(task, space, subnet, card: dict[str, Any]) -> Facts:
    """The Facts of an exported image classifier's folder."""
    d = card.get("data") or {}
    classes = [str(c) for c in (d.get("classes") or range(space.classes))]
    metrics = []
    for split in ("validation", "test"):
        entry = card.get(split) or {}
        if entry.get("accuracy") is not None:
            metrics.append(Metric(f"{split} top-1 accuracy", "accuracy", float(entry["accuracy"]), "fraction correct", split))
    name = d.get("source") or d.get("corpus") or "the training images"
    data = (f"Trained on {name} (hash {d.get('hash')}, {len(classes)} classes); augmentation: "
            f"{card.get('augmentation', 'none recorded')}.")
    training = card.get("training")
    words = (f"Trained on its own (`nas train-subnet`): {training.get('steps')} steps." if training else
             "Weights inherited from the weight-shared ViT supernet, not retrained.")
    return Facts("image-classification", vision_config(space, subnet, classes), "A vision Transformer image classifier",
                 tuple(metrics), (str(name),), data, words, USAGE, tags=("image-classification", "vision"),
                 layers=tuple(stack_layers(space, subnet.stack())), subnet=str(subnet))  # fmt: skip

"""Tasks: what is learned, one object per task, one folder each.

A task (:class:`~.base.Task`) knows everything about itself that the generic layers do not: its space
format and genes, its data and batches, its model parts, its loss and held-out metric, its latency
workloads and cost features, its export artifacts, and the extra flags of the commands.  The layers
(``search_spaces`` < ``supernet`` < ``latency`` < ``nas``) never import this package: they ask the
registry (:mod:`search_spaces.tasks`), which imports it through the ``nas_transformers.tasks`` entry
point.  The tasks, one folder each:

* :mod:`.causal_lm`: next-byte prediction by a decoder (every position scored);
* :mod:`.masked_lm`: BERT-style masked bytes for an encoder (the chosen positions scored);
* :mod:`.translation`: an encoder-decoder translating sentence pairs (HAT's space and workload);
* :mod:`.image_classification`: a vision Transformer over a grid of image patches (Fashion-MNIST).

Each declares its name (the ``task:`` of a space file) in its own folder.

To add a task: a folder with a :class:`~.base.Task` subclass (:class:`~.stack.StackTask` for a model that is
one stack of blocks over a sequence) and ``register(MyTask())``; the commands then run it.
"""

from search_spaces.tasks import declare as register
from search_spaces.tasks import get, of, tasks
from search_spaces.tasks import withdraw as unregister

from . import causal_lm, image_classification, masked_lm, translation, sequence_classification  # noqa: F401, I001  (importing registers the tasks, in this order)

__all__ = ["get", "of", "register", "tasks", "unregister"]

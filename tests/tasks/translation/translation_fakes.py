"""A mini encoder-decoder space and a toy parallel corpus, small enough for unit tests on 2 cores."""

from search_spaces import parse_space

MINI_SEQ2SEQ = """
name: mini-s2s
task: seq2seq
vocab_size: 259
max_seq_len: 40
head_dim: 8
positions: {positions}
encoder:
  embed_dim: [16, 24]
  depth: [3]
  layers: {{heads: [1, 2], ffn_dim: [16, 32], attention: [softmax, 'local:4', linear]}}
decoder:
  embed_dim: [16, 24]
  depth: [1, 2]
  layers: {{heads: [1, 2], ffn_dim: [16, 32], attention: [softmax, 'local:4', linear], cross_heads: [1, 2],
           cross_layers: [1, 2, 3]}}
latency:
  translate: {{source: 16, steps: 16, beam: 3}}
"""


def mini_space(positions: str = "rope"):
    return parse_space(MINI_SEQ2SEQ.format(positions=positions), where="mini-s2s.yaml")


WORDS = ["file", "open", "close", "save", "error", "not", "found", "the", "a", "new", "name", "user"]
GERMAN = ["Datei", "öffnen", "schließen", "speichern", "Fehler", "nicht", "gefunden", "die", "eine", "neu", "Name", "Nutzer"]


def write_toy_tsv(path, n: int = 120, seed: int = 0):
    """``n`` word-by-word "translations" of 1-4 words (a learnable toy: each word maps to one German word)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        idx = rng.integers(0, len(WORDS), size=int(rng.integers(1, 5)))
        lines.append(" ".join(WORDS[i] for i in idx) + "\t" + " ".join(GERMAN[i] for i in idx))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path

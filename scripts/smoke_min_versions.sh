#!/usr/bin/env bash
# The declared minimum versions, smoke-tested (CI runs this after the test suite; a few minutes, most of it pip):
#   a fresh virtual environment with no torch, set up by the README's command (scripts/install.py) with
#   constraints-min.txt: the installer must choose a CPU build of torch (no NVIDIA driver here), and every other
#   dependency must be installed at its floor; then the workflow in miniature at those versions: a micro space,
#   5 supernet steps, 12 subnets timed on ONNX Runtime (opset 23 graphs), a predictor, a 2-generation search on
#   SQLite storage, the winner and the largest subnet (softmax: a fused opset-23 Attention node) exported
#   with ONNX Runtime and torch.export parity checks, chrF/BLEU through sacrebleu.
# Usage: scripts/smoke_min_versions.sh [WORKDIR]   (default: a new temporary folder, removed at the end; a WORKDIR is
# kept, and a second run in it reuses its environment)
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-$(mktemp -d)}"
keep="${1:+yes}"
mkdir -p "$work"
rm -rf "$work"/{sn,lat.csv,lat.json,pred,search,model,largest,docs}  # an earlier run's outputs (its venv stays)
[ -n "$keep" ] || trap 'rm -rf "$work"' EXIT
venv="$work/venv"
t0=$SECONDS
say() { echo "smoke_min_versions [$((SECONDS - t0)) s]: $*"; }

py="$venv/bin/python"
if [ ! -x "$py" ]; then  # a WORKDIR of an earlier run keeps its environment
    python3 -m venv "$venv"
    # PyTorch's CPU index is unreachable from this project's machines: the installer says so and asks pip for PyPI's
    # torch in the tested range, which pip takes from the local CPU wheel it is configured with (an ordinary machine
    # reaches the index and takes the +cpu build from there).
    PIP_RETRIES=0 "$py" scripts/install.py translate -c constraints-min.txt
    say "installed"
fi

"$py" - <<'EOF'
import importlib.metadata as md
import re

import torch

assert torch.version.cuda is None and not getattr(torch.version, "hip", None), f"not a CPU build of torch: {torch.__version__}"
pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", open("constraints-min.txt").read(), re.M))
wrong = {name: (want, md.version(name)) for name, want in pins.items() if md.version(name) != want}
assert not wrong, f"not at the declared minimum (wanted, installed): {wrong}"
deps = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower(): r for r in md.requires("nas-transformers") if "extra ==" not in r}
floors = {n.lower(): v for n, v in pins.items()}
unpinned = sorted(set(deps) - set(floors) - {"torch"})
assert not unpinned, f"dependencies without a line in constraints-min.txt: {unpinned}"


def same(a, b):  # 1.24 == 1.24.0
    pa, pb = a.split("."), b.split(".")
    n = max(len(pa), len(pb))
    return pa + ["0"] * (n - len(pa)) == pb + ["0"] * (n - len(pb))


for name, req in deps.items():  # each pin is the floor that pyproject.toml declares
    floor = re.search(r">=\s*([0-9][0-9.]*)", req)
    assert floor, f"{req}: no floor declared"
    assert name == "torch" or same(floor.group(1), floors[name]), f"pyproject.toml says {req}, constraints-min.txt {floors[name]}"
print(f"torch {torch.__version__} (CPU); {len(pins)} dependencies at their declared minimum")
EOF

nas="$venv/bin/nas"
export NAS_NATIVE_KERNELS=0  # the compiled attention kernels' build is the test suite's business, not the floors'
"$nas" --version
"$nas" space tiny >/dev/null
cat > "$work/micro.yaml" <<'EOF'
name: micro
task: causal-lm
vocab_size: 256
max_seq_len: 32
head_dim: 8
positions: rope
embed_dim: [16, 24]
depth: [1, 2]
layers: {heads: [1, 2], ffn_dim: [32, 64], attention: [softmax, 'local:8', linear]}
latency: {prefill: {batch_size: 1, seq_len: 32}}
EOF
mkdir -p "$work/docs"
for i in 0 1 2 3 4 5 6 7; do "$py" -c "import random; r = random.Random($i); print(' '.join(f'w{r.randrange(50)}' for _ in range(300)))" > "$work/docs/doc$i.txt"; done
head -c 2000 "$work/docs/doc0.txt" > "$work/val.txt"

"$nas" train-supernet -q "$work/micro.yaml" --out "$work/sn" --data "$work/docs" --max-steps 5 --batch-size 4 --seq-len 16 \
    --threads 1 --eval-batches 2
say "trained"
"$nas" measure-latency -q "$work/micro.yaml" --timing-target onnxruntime --samples 12 --timing-warmup 2 --repeats 3 \
    --rounds 1 --timing-threads 1 --out "$work/lat.csv"
say "timed"
"$nas" fit-predictor -q "$work/lat.csv" --models additive --folds 2 --out "$work/pred"
"$nas" search -q "$work/sn/final.pt" --predictor "$work/pred" --budget 50ms --population 6 --parents 2 --mutations 2 \
    --crossovers 2 --generations 2 --val-data "$work/val.txt" --val-windows 4 --seq-len 16 --out "$work/search" --no-progress
say "searched"
"$nas" export -q "$work/sn/final.pt" --subnet "$work/search/best_50ms.yaml" --out "$work/model" \
    --val-data "$work/val.txt" --val-windows 4 --seq-len 16 --format torch,onnx
"$py" -c "from search_spaces import load_space; print(load_space('$work/micro.yaml').largest().to_yaml())" > "$work/largest.yaml"
"$nas" export -q "$work/sn/final.pt" --subnet "$work/largest.yaml" --out "$work/largest" --no-eval --format torch,onnx
"$py" - "$work/model" "$work/largest" <<'EOF'
import json
import sys
from pathlib import Path

for folder in sys.argv[1:]:
    card = json.loads((Path(folder) / "model_card.json").read_text())
    assert card["onnx"]["opset"] == 23 and card["onnx"]["parity_max_abs"] <= 1e-4, card["onnx"]
    assert card["torch_program"]["parity_max_abs"] <= 1e-4, card["torch_program"]
assert card["onnx"]["op_counts"].get("Attention", 0) >= 1, card["onnx"]["op_counts"]  # the largest: softmax, fused
from tasks.translation.decode import score_translations

assert score_translations(["the file was not found"], ["the file was not found"])["chrf"] == 100.0
print(f"ONNX parity {card['onnx']['parity_max_abs']:.2e}; sacrebleu scores")
EOF
say "exported; the minimum versions pass"

"""Run folders for the `nas report` tests, written as the toolkit writes them (shapes copied from a real
`nas search --verify` and `nas demo`), without training or timing anything: a search, a predictor, a model card, a
supernet's log and the demo around them."""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from dataclasses import asdict
from pathlib import Path

FOUND = {"embed_dim": 128, "depth": 2, "heads": [2, 4], "ffn_dim": [128, 128], "attention": ["gqa:2", "gqa:2"]}
SUBNETS = ["d64 L4 [4x 4h/256/softmax]", "d128 L4 [4x 2h/128/gqa:2]", "d128 L3 [3x 1h/256/local:32]",
           "d128 L3 [3x 1h/256/strided:16]", "d96 L4 [4x 1h/256/linear]", "d128 L2 [2h/128/gqa:2, 4h/128/gqa:2]"]


def png(width: int = 1, height: int = 1) -> bytes:
    """A valid grayscale PNG of ``width`` x ``height`` pixels as its header declares (the data: one row's worth)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" + b"\x80" * min(width, 64)))
            + chunk(b"IEND", b""))


def write_json(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    return path


def search_folder(out: Path) -> Path:
    """A `nas search --budget 6ms --margin 20 --verify` folder: search.json, pareto.csv (12 subnets over 2
    generations), verify.json and verify.csv, pareto.png."""
    out.mkdir(parents=True, exist_ok=True)
    best = {"subnet": FOUND, "key": "ddf5b0af90d4feb4", "loss_bpb": 7.818936941545322, "latency_ms": 3.194954761291163,
            "params": 182720, "trial": 7, "file": "best_6ms.yaml"}
    write_json(out / "search.json", {
        "nas_version": "0.2.0", "study": "evolution-seed0-e0be76ee", "storage": f"sqlite:///{out}/search.db",
        "config": {"space": "da94ba0c4d5db6bf", "supernet": "4e8c958f1ad19b37", "predictor": "c8d7b24a9fa0b3df",
                   "fitness": {"windows": 3, "seq_len": 32, "seed": 0, "tokens": 96, "data": "5f0f131826e9f4b6"},
                   "strategy": "evolution", "search": {"population": 6, "parents": 2, "mutations": 3, "crossovers": 3,
                                                       "generations": 2, "mutate_prob": 0.3, "selection": "top",
                                                       "tournament_size": 10, "aging": False, "max_tries": 100},
                   "seed": 0, "budgets": ["6ms"], "max_params": None, "margin_pct": 20.0},
        "evaluations": 12,
        "budgets": {"6ms": {"constraints": "latency <= 4.8ms (fake, additive predictor from predictor/ at prefill)",
                            "evaluated": 12, "notes": [], "best": best, "budgets_ms": {"prefill": 4.8}}},
        "figure": {"title": "evolution on tiny: 12 subnets", "ylabel": "bits/byte on 3 held-out windows x 32 tokens "
                   "(inherited weights)", "budgets_ms": [6.0], "limits_ms": [4.8]},
        "workload": "prefill", "hypervolume": {"value": 0.2567, "reference": [7.91, 6.0]}})
    rows = ["trial,budget,generation,loss_bpb,latency_ms,params,on_front,key,subnet"]
    for t in range(12):
        gen = 0 if t < 6 else 1
        loss, ms = (7.818937, 3.194955) if t == 7 else (7.87 - 0.004 * (t % 6), 4.70 + 0.01 * t)
        rows.append(f"{t},6ms,{gen},{loss:.6f},{ms:.6f},{282752 - t},{int(t == 7)},k{t},{SUBNETS[t % 6]}")
    (out / "pareto.csv").write_text("\n".join(rows) + "\n")
    check = {"budget": "6ms", "budget_ms": 6.0, "params": 182720, "key": "ddf5b0af90d4feb4", "subnet": FOUND}
    checks = [{**check, "rank": 1, "trial": 7, "loss_bpb": 7.818936941545322, "predicted_ms": 3.194954761291163,
               "measured_ms": 3.0298144, "error_pct": -5.169, "holds": True, "kept": True, "flags": "load"},
              {**check, "rank": 2, "trial": 1, "loss_bpb": 7.8214, "predicted_ms": 4.785, "measured_ms": 4.8426,
               "error_pct": 1.203, "holds": True, "kept": False, "flags": "load"}]
    write_json(out / "verify.json", {
        "device": {"device": "fake", "runtime": "fake", "threads": 1, "cpu_model": "fake cpu", "hostname": "here"},
        "workload": {"name": "prefill", "batch_size": 1, "seq_len": 256, "kind": "prefill", "context": 0},
        "settings": {"warmup": 20, "repeats": 60, "rounds": 10}, "budgets": {"6ms": {"budget_ms": 6.0, "checks": checks}}})
    (out / "verify.csv").write_text("budget,rank\n6ms,1\n6ms,2\n")
    (out / "pareto.png").write_bytes(png(4, 3))
    return out


def predictor_folder(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    metric = {"n": 20, "rmse_ms": 0.11, "mape": 0.024, "within_5": 0.9, "within_10": 1.0, "kendall_tau": 0.93}
    write_json(out / "predictor.json", {
        "format": "nas-latency-predictor", "version": 1, "model": "additive",
        "fingerprint": {"device": "onnxruntime", "cpu_model": "fake cpu", "python": "3.11.7", "onnxruntime": "1.32.0"},
        "workload": {"name": "prefill"},
        "metrics": {"chosen": "additive", "cv": {"additive": metric}, "held_out": metric, "test_retest": metric}})
    (out / "predicted_vs_measured.png").write_bytes(png(5, 5))
    return out


def card(found: dict = FOUND, loss: float = 7.8189, predicted: float = 3.195) -> dict:
    device = {"device": "onnxruntime", "python": "3.11.7", "onnxruntime": "1.32.0"}
    return {"format": "nas-exported-model", "version": 1, "subnet": found, "parameters": 182720,
            "validation": {"metric": "bits/byte", "bits_per_byte": loss, "windows": 3, "seq_len": 32,
                           "source": "supernet's validation split"},
            "latency": {"predicted_ms": predicted, "model": "additive", "device": device},
            "measured": {"median_ms": 3.03, "iqr_ms": 0.021, "timed": "the static model, beside the uniform baselines",
                         "error_pct": -5.2, "flags": ["load"], "device": device},
            "source": {"supernet": "runs/demo/supernet/latest.pt", "step": 100}}


def log_lines(steps: int = 100, every: int = 10) -> list[str]:
    """A supernet's log.jsonl: start, train events (loss in nats per subnet), eval events (bits/byte), end."""
    events = [{"event": "start", "step": 0, "meta": {"seed": 0}}]
    for step in range(every, steps + 1, every):
        events.append({"event": "train", "step": step, "lr": 1e-3, "tokens": step * 1024, "tokens_per_s": 1000.0,
                       "loss": {"largest": 5.0 - step / 50, "smallest": 5.2 - step / 60}, "elapsed": step / 10})
        if step % 50 == 0:
            events.append({"event": "eval", "step": step, "bpb": {"largest": 7.0 - step / 100, "smallest": 7.3 - step / 120},
                           "seconds": 1.0})
    events.append({"event": "end", "step": steps, "stopped": "max_steps", "elapsed": 10.0, "tokens": steps * 1024})
    return [json.dumps(e) for e in events]


def demo_rows(found: dict, loss: float, predicted: float) -> list[dict]:
    """comparison.csv's rows: the found model, then uniform baselines; "uniform softmax" and "uniform gqa:2" are one
    model (2 heads: 2 groups of 2 heads is softmax), timed twice; "uniform local:32" is slower than the found model."""
    from search_spaces import Subnet

    def row(name, subnet, params, bpb, search_bpb, pred, measured, **kw):
        return {"name": name, "subnet": subnet, "key": f"k{len(name)}{params}", "params": params, "bpb": bpb,
                "bpb_windows": 16, "search_bpb": search_bpb, "search_windows": 3, "predicted_ms": pred,
                "measured_ms": measured, "measured_iqr_ms": 0.021, "flags": "load", **kw}

    return [row("found", str(Subnet.from_dict(found)), 182720, 7.7012345, loss, predicted, 3.03),
            row("uniform softmax", "d128 L2 [2x 2h/128/softmax]", 150000, 7.9123456, 7.95, 2.5, 2.61,
                vs_found_bpb=0.2111, vs_found_se=0.0123),
            row("uniform gqa:2", "d128 L2 [2x 2h/128/gqa:2]", 150000, 7.9123456, 7.95, 2.5, 2.64,
                vs_found_bpb=0.2111, vs_found_se=0.0123),
            row("uniform linear", "d96 L3 [3x 1h/256/linear]", 120000, 7.99, 8.01, 2.9, 2.95, vs_found_bpb=0.29,
                vs_found_se=0.011),
            row("uniform local:32", "d128 L4 [4x 4h/512/local:32]", 400000, 7.6, 7.7, 5.5, 5.61, vs_found_bpb=-0.1,
                vs_found_se=0.02)]


def demo_folder(root: Path, search: Path | None = None, predictor: Path | None = None) -> Path:
    """A `nas demo --quick` run folder as run_demo writes it: summary.json, comparison.csv, search/, predictor/,
    model/model_card.json, supernet/log.jsonl; ``search`` and ``predictor``: real folders to copy (else written)."""
    from nas.demo import QUICK, _write_csv, demo_command

    root.mkdir(parents=True)
    if search is not None:
        shutil.copytree(search, root / "search")
    else:
        search_folder(root / "search")
    if predictor is not None:
        shutil.copytree(predictor, root / "predictor")
    else:
        predictor_folder(root / "predictor")
    best = json.loads((root / "search" / "search.json").read_text())["budgets"]["6ms"]["best"]
    rows = demo_rows(best["subnet"], best["loss_bpb"], best["latency_ms"])
    _write_csv(root / "comparison.csv", rows)
    write_json(root / "summary.json", {
        "budget_ms": 6.0, "found": {**rows[0], "subnet": best["subnet"]}, "error_pct": -5.2, "within_budget": True,
        "baselines": rows[1:], "beats_baselines": True, "baselines_at_or_below_found_latency": 3,
        "sample": "def f(x):\n    return x", "files": {}, "stage_seconds": {"train the supernet": 60.2, "search": 31.0},
        "plan": asdict(QUICK), "command": demo_command(root, QUICK, 0, None)})
    write_json(root / "model" / "model_card.json", card(best["subnet"], best["loss_bpb"], best["latency_ms"]))
    (root / "supernet").mkdir()
    (root / "supernet" / "log.jsonl").write_text("\n".join(log_lines()) + "\n")
    return root

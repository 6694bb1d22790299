"""Runner of a latency bundle: times its ONNX graphs with ONNX Runtime and writes a timing table.

In the bundle, ``runner.py`` is :mod:`latency.timing_core` followed by this file (the import
below is replaced by that text, after a preamble that checks Python >= 3.10, numpy and onnxruntime),
so it needs only those.

    python runner.py                  # -> timings.csv + timings.csv.json in the current folder
    python runner.py --threads 4 --out board.csv
    python runner.py --parity out.npz # no timing: every graph's outputs, to compare two machines or runtimes

A bundle written with ``--custom-ops`` carries the board's custom-op library (``lib/``, named by the manifest's
``custom_ops``); every session registers it.  ``--custom-ops-library FILE`` registers another build of it instead (the
x86 side of a parity check).

Running it again with the same --out resumes. Give the CSV (and its .json) to
``nas fit-predictor``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from latency.timing_core import *  # noqa: F401,F403  (BUNDLE: inlined here)
from latency.timing_core import CLOCKS, Settings, append_rows, check_clock, decode_inputs, format_row, image_feed, host_facts, ort_runner, ort_session, prefill_tokens, run_protocol, sidecar_path, translate_ort_runner, write_atomic, write_json  # noqa: E501,F811

HERE = os.path.dirname(os.path.abspath(__file__))
INFORMATIONAL = ("hostname", "created", "command")


def version_tuple(text: str) -> tuple:
    return tuple(int(p) for p in text.split("+")[0].split(".")[:3] if p.isdigit())


def fingerprint(ort, manifest: dict, threads, provider: str, clock: str) -> dict:
    custom = {"custom_ops": os.path.basename(manifest["custom_ops"])} if manifest.get("custom_ops") else {}
    return {
        **custom,
        **host_facts(),
        "device": "onnxruntime",
        "runtime": f"onnxruntime-{provider}",
        "onnxruntime": ort.__version__,
        "threads": threads or "default",
        "clock": clock,
        "opset": manifest["opset"],
        "exporter_torch": manifest["exporter_torch"],
        "graph_optimization": "all",
    }


def done_keys(path: str) -> set:
    import csv

    if not os.path.exists(path):
        return set()
    with open(path, newline="") as f:
        return {(r["key"], r["pass"]) for r in csv.DictReader(f)}


def library_register(library):
    """``ort_session``'s register hook for a custom-op library (None: none to register)."""
    if library is None:
        return None
    return lambda options, _path: options.register_custom_ops_library(library)


def write_parity(path: str, entries: list, feed_of, threads, provider: str, register=None) -> None:
    """``path`` (.npz): each distinct graph's outputs, as ``<graph file>:<output index>``, on its timing inputs."""
    arrays = {}
    for entry in entries:
        name = os.path.basename(entry["graph"])
        if any(k.startswith(name + ":") for k in arrays):
            continue
        session = ort_session(os.path.join(HERE, entry["graph"]), entry["tensors"], threads=threads, provider=provider,
                              register=register)  # fmt: skip
        for i, value in enumerate(session.run(None, feed_of(entry))):
            arrays[f"{name}:{i}"] = value
        del session
    write_atomic(path, lambda f: np.savez(f, **arrays))


def smallest_vocab(space: dict) -> int:
    """The ids every model of the bundle reads: a space that searches its vocabulary (``tokenizer: {bpe: [...]}``) has
    models of several embedding sizes, nested, so the tokens are drawn below the smallest."""
    sizes = ((space.get("tokenizer") or {}) if isinstance(space.get("tokenizer"), dict) else {}).get("bpe")
    if sizes is None:
        return space["vocab_size"]
    sizes = sizes if isinstance(sizes, list) else [sizes]
    return min(256 if k == "bytes" else k for k in sizes)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Time this bundle's ONNX graphs with ONNX Runtime; write a timing table.",
                                allow_abbrev=False)
    p.add_argument(
        "--out", default="timings.csv", help="CSV to write (a .json sidecar is written beside it); resumes if it exists"
    )
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: its own choice)")
    p.add_argument("--provider", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="wall",
        help="wall (default) or cpu: the thread's CPU time, for a shared machine (needs --threads 1)",
    )
    p.add_argument("--memory-mb", type=float, default=1024, help="weights held in memory at once (models are timed in groups)")
    p.add_argument("--parity", metavar="FILE.npz", help="instead of timing: write every graph's outputs (on the timing inputs, "
                   "with the seeded weights) to FILE.npz, to compare with another machine or runtime")
    p.add_argument("--custom-ops-library", metavar="FILE", help="register this build of the custom operators instead of "
                   "the bundle's (lib/; for another machine's side of a parity check)")
    args = p.parse_args(argv)
    try:
        check_clock(args.clock, args.threads)
    except ValueError as e:
        p.error(str(e))

    with open(os.path.join(HERE, "manifest.json")) as f:
        manifest = json.load(f)
    library = args.custom_ops_library or (os.path.join(HERE, manifest["custom_ops"]) if manifest.get("custom_ops") else None)
    if library is not None and not os.path.isfile(library):
        print(f"error: --custom-ops-library: {library} is not a file" if args.custom_ops_library else
              f"error: the bundle's custom-op library {manifest['custom_ops']} is missing", file=sys.stderr)
        return 2
    register = library_register(library)
    try:
        import onnxruntime as ort
    except ImportError:
        print("error: onnxruntime is not installed: pip install 'onnxruntime>=%s'" % manifest["min_onnxruntime"], file=sys.stderr)
        return 2
    if version_tuple(ort.__version__) < version_tuple(manifest["min_onnxruntime"]):
        print(f"error: onnxruntime {ort.__version__} is too old for these graphs (opset {manifest['opset']}); "
              f"pip install 'onnxruntime>={manifest['min_onnxruntime']}'", file=sys.stderr)
        return 2

    settings = Settings.from_dict(manifest["meta"]["protocol"])
    workload = manifest["meta"]["workload"]
    tokens = None if workload.get("kind") in ("translate", "image") else prefill_tokens(
        smallest_vocab(manifest["meta"]["space"]), workload["batch_size"], workload.get("seq_len", 1))

    def feed_of(entry: dict) -> dict:
        """Prefill: the same tokens for every model; decode: inputs of `context` tokens seen, from the graph's input layout;
        image: the same seeded images for every model, of the entry's shape."""
        if workload.get("kind") == "image":
            return image_feed(workload["batch_size"], entry["images"])
        if "seq_len" in entry:  # a prefill in bytes of text: this model's vocabulary's tokens for them (a prefix)
            return {name: values[:, : entry["seq_len"]] for name, values in tokens.items()}
        return (
            decode_inputs(entry["inputs"], workload["batch_size"], workload["context"])
            if workload.get("kind") == "decode"
            else tokens
        )

    def runner_of(entry: dict):
        """The timed call of one entry: its graph on its inputs, or for a translate workload HAT's loop on its two graphs."""
        session = ort_session(os.path.join(HERE, entry["graph"]), entry["tensors"], threads=args.threads, provider=args.provider,
                              register=register)  # fmt: skip
        if workload.get("kind") != "translate":
            return ort_runner(session, feed_of(entry), args.clock)
        step = ort_session(os.path.join(HERE, entry["step_graph"]), entry["step_tensors"], threads=args.threads,
                           provider=args.provider, register=register)  # fmt: skip
        return translate_ort_runner(session, step, entry["inputs"], workload["source"], workload["steps"], workload["beam"],
                                    args.clock)  # fmt: skip

    if args.parity and workload.get("kind") == "translate":
        print("error: --parity: not for a translate bundle yet (an encoder-decoder's two graphs)", file=sys.stderr)
        return 2
    if args.parity:  # outputs only, no timing, no table
        write_parity(args.parity, [manifest["reference"]] + manifest["models"], feed_of, args.threads, args.provider, register)
        print(f"wrote {args.parity}")
        return 0

    meta = dict(manifest["meta"])
    meta["fingerprint"] = {**meta["fingerprint"], **fingerprint(ort, manifest, args.threads, args.provider, args.clock)}
    side = sidecar_path(args.out)
    if os.path.exists(args.out) and os.path.exists(side):
        with open(side) as f:
            stored = json.load(f)
        diff = sorted(k for k in set(stored["fingerprint"]) | set(meta["fingerprint"])
                      if k not in INFORMATIONAL and stored["fingerprint"].get(k) != meta["fingerprint"].get(k))
        if diff:
            print(
                f"error: {args.out} was measured with another fingerprint ({', '.join(diff)}); use another --out", file=sys.stderr
            )
            return 2
        meta["baseline_ms"] = stored.get("baseline_ms")
    else:
        write_json(side, meta)

    ref = manifest["reference"]
    ref_runner = runner_of(ref)
    done = done_keys(args.out)
    todo = [m for m in manifest["models"] if (m["key"], m["pass"]) not in done]
    print(
        f"{len(manifest['models']) - len(todo)} of {len(manifest['models'])} already measured in {args.out}; timing {len(todo)}",
        flush=True,
    )

    groups, size = [], args.memory_mb + 1
    for m in todo:
        mb = sum(t["nbytes"] for t in m["tensors"] + m.get("step_tensors", [])) / 2**20
        if size + mb > args.memory_mb and (not groups or groups[-1]):
            groups.append([])
            size = 0.0
        groups[-1].append(m)
        size += mb
    start, total, finished = time.time(), len(todo) * settings.rounds, 0
    for g_index, group in enumerate(groups):
        runners = {}
        for m in group:
            runners[m["key"] + "/" + m["pass"]] = runner_of(m)

        def progress(d, group_total, key, base=finished):
            nonlocal total
            n = base + d
            total = max(total, base + group_total + (len(todo) - sum(len(g) for g in groups[: g_index + 1])) * settings.rounds)
            eta = (time.time() - start) / max(n, 1) * (total - n)
            print(f"\r{n}/{total} visits, ETA {eta / 60:.1f} min ", end="", flush=True)

        rng = np.random.default_rng([manifest["seed"], 7, g_index])
        results, baseline = run_protocol(
            runners, ref_runner, settings, rng, baseline_ms=meta.get("baseline_ms"), progress=progress
        )
        if meta.get("baseline_ms") is None:
            meta["baseline_ms"] = baseline
            write_json(side, meta)
        rows = [
            format_row(
                m["key"], m["pass"], m["subnet"], m["features"], results[m["key"] + "/" + m["pass"]], manifest["workload_label"]
            )
            for m in group
        ]
        append_rows(args.out, meta["columns"], rows)
        finished += len(group) * settings.rounds
    print(f"\nwrote {args.out} and {side}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A fake :class:`nas.search.hurdles.CandidateTrainer`: deterministic, fast, resumable, and killable midway.

A "model folder" is ``model.json`` (the subnet and the tokens it has been trained on, over all rounds);
its bits/byte is :func:`fake_bpb` of the two, a learning curve per subnet (curves cross, so the
hurdles have something to decide).  A training runs ``tokens // step_tokens`` steps, writes its
checkpoint ``train/latest.pt`` (JSON here) every ``ckpt_every`` steps, and appends what each call did
to ``train/log.jsonl`` (``start`` with the step it started from, ``end``), so tests can see a killed
training continue from its checkpoint and no training run twice.  With ``hang_after`` the process
writes ``marker`` and hangs after that many steps (all its trainings together): kill it there; with
``stop_after`` the training saves its checkpoint and raises ``TrainingStopped`` there (as Ctrl-C would).
"""

from __future__ import annotations

import json
import math
import os
import time
import zlib
from pathlib import Path

from nas.search.hurdles import TRAIN_BATCH, TrainingStopped
from search_spaces import Subnet

from tests.nas.search.test_search_storage import synthetic_loss

MODEL = "model.json"
STEP_TOKENS = 100


def fake_bpb(subnet: Subnet, tokens: int) -> float:
    """The synthetic inherited loss, lowered by training: each subnet gains its own amount, at one rate."""
    gain = 0.2 + 0.8 * (zlib.crc32(f"gain:{subnet.key}".encode()) % 1000) / 1000
    return float(synthetic_loss(subnet) - gain * (1 - math.exp(-tokens / 2000)))


def log_of(folder: Path) -> list[dict]:
    path = Path(folder) / "train" / "log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class FakeTrainer:
    def __init__(self, tokens: int, *, step_tokens: int = STEP_TOKENS, sleep: float = 0.0, ckpt_every: int = 2,
                 hang_after: int | None = None, marker: Path | None = None, stop_after: int | None = None,
                 seq_len: int | None = None, **_context):
        if seq_len is not None:  # made by nas search (trainer_factory's arguments): the real trainer's steps
            step_tokens = TRAIN_BATCH * seq_len
        self.tokens, self.step_tokens, self.sleep, self.ckpt_every = tokens, step_tokens, sleep, ckpt_every
        self.hang_after, self.marker, self.stop_after = hang_after, marker, stop_after
        self.description = {"trainer": "fake", "tokens": tokens, "step_tokens": step_tokens}
        self.steps_done = 0  # by this process, every training together
        self.calls: list[tuple[str, int, bool]] = []  # (subnet key, round, resume)

    def train(self, subnet: Subnet, round: int, init: Path | None, out: Path, resume: bool) -> Path:
        out, state = Path(out), Path(out) / "train"
        self.calls.append((subnet.key, round, resume))
        if init is None:
            start_tokens = 0
        else:
            previous = json.loads((Path(init) / MODEL).read_text())
            assert previous["key"] == subnet.key and previous["tokens"] == round * self.tokens, (previous, round)
            start_tokens = previous["tokens"]
        step = 0
        if resume:
            ckpt = json.loads((state / "latest.pt").read_text())
            assert ckpt["start_tokens"] == start_tokens
            step = ckpt["step"]
        else:
            assert not out.exists() or not any(out.iterdir()), f"{out}: a fresh training into a folder that holds files"
        state.mkdir(parents=True, exist_ok=True)
        self._log(state, {"event": "start", "step": step, "pid": os.getpid()})
        steps = self.tokens // self.step_tokens
        while step < steps:
            time.sleep(self.sleep)
            step += 1
            self.steps_done += 1
            if step % self.ckpt_every == 0 or step == steps:
                self._write(state / "latest.pt", {"step": step, "start_tokens": start_tokens})
            if self.hang_after is not None and self.steps_done >= self.hang_after:
                self.marker.write_text(f"{subnet.key} round {round} step {step}")
                time.sleep(600)
            if self.stop_after is not None and self.steps_done >= self.stop_after and step < steps:  # as Ctrl-C does
                self._write(state / "latest.pt", {"step": step, "start_tokens": start_tokens})
                self._log(state, {"event": "stopped", "step": step, "pid": os.getpid()})
                raise TrainingStopped(f"{subnet} round {round}: stopped at step {step} of {steps}")
        tokens = start_tokens + steps * self.step_tokens
        self._write(out / MODEL, {"key": subnet.key, "subnet": subnet.to_dict(), "tokens": tokens})
        self._log(state, {"event": "end", "step": step, "pid": os.getpid()})
        return out

    def score(self, folder: Path) -> float:
        model = json.loads((Path(folder) / MODEL).read_text())
        return fake_bpb(Subnet.from_dict(model["subnet"]), model["tokens"])

    @staticmethod
    def _write(path: Path, data: dict) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)

    @staticmethod
    def _log(state: Path, entry: dict) -> None:
        with open(state / "log.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")


class TableTrainer(FakeTrainer):
    """Bits/byte from a hand-written table ``{(subnet key, round): bpb}`` instead of a curve."""

    def __init__(self, tokens: int, table: dict[tuple[str, int], float], **kw):
        super().__init__(tokens, **kw)
        self.table = table
        self.description = {**self.description, "table": sorted(f"{k}:{r}:{v}" for (k, r), v in table.items())}

    def score(self, folder: Path) -> float:
        model = json.loads((Path(folder) / MODEL).read_text())
        return self.table[(model["key"], model["tokens"] // self.tokens - 1)]

"""Fakes for the latency tests: a fake clock, runners whose cost is known, a fake device, a micro space."""

from __future__ import annotations

from search_spaces import parse_space

# One embedding width and one layer choice whose sizes equal the reference model's
# (8 heads of 8, FFN 32 x 8): every ONNX part is shared, so the ONNX tests export only three.
MICRO = """
name: micro
task: causal-lm
vocab_size: 64
max_seq_len: 32
head_dim: 8
positions: rope
embed_dim: [64]
depth: [1, 2, 3]
layers:
  heads: [8]
  ffn_dim: [256]
  attention: [softmax]
latency:
  prefill: {batch_size: 1, seq_len: 16}
"""


def micro_space(decode: bool = False):
    """The micro space; ``decode``: with a decode workload too (context 20) after its prefill one."""
    text = MICRO + "  decode: {batch_size: 1, context: 20}\n" if decode else MICRO
    return parse_space(text, where="micro.yaml")


class FakeClock:
    """Time advances only when a fake runner runs; ``slow`` lists (start, end, factor) windows; a call runs at the
    speed of its start."""

    def __init__(self, slow=(), speed=None):
        self.now = 0.0
        self.slow = list(slow)
        self.speed = speed  # optional: time -> slowdown factor, on top of the windows
        self.log: list[str] = []

    def factor(self) -> float:
        f = self.speed(self.now) if self.speed is not None else 1.0
        for start, end, k in self.slow:
            if start <= self.now < end:
                f *= k
        return f

    def runner(self, name: str, seconds: float):
        def run(n: int) -> float:
            dt = n * seconds * self.factor()
            self.now += dt
            self.log.append(name)
            return dt

        return run


class FakeDevice:
    """A device whose runner costs 1 ns per parameter (plus 0.2 ms), timed on a fake clock."""

    name = "fake"

    def __init__(self, clock: FakeClock | None = None, threads: int = 1):
        self.clock = clock or FakeClock()
        self.threads = threads

    def fingerprint(self) -> dict:
        return {"device": "fake", "runtime": "fake", "threads": self.threads, "cpu_model": "fake cpu", "hostname": "here"}

    def prepare(self, model, workload):
        cost = 2e-4 + 1e-9 * model.num_params() * workload.seq_len / 16
        return self.clock.runner(str(model.config.embed_dim) + "/" + str(len(model.config.layers)), cost)

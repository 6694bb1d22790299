"""Translating with an encoder-decoder: greedy and beam search, with and without the decoding cache; chrF / BLEU.

The source is encoded once and every decoder layer's cross-attention keys and values are computed
once per source (:func:`tasks.translation.model.encode_memory`).  With ``cache=True`` each decoder layer keeps
its self-attention state (its attention type's, :class:`~supernet.model.Prefill` then
:class:`~supernet.model.Step`, as LM decoding does) and a step feeds one byte; with ``cache=False``
every step reruns the decoder over the whole prefix (the reference the tests hold the cache to).

Beam search keeps ``beam`` live hypotheses; each step extends them by every byte and EOS, keeps the
best ``beam`` that do not end, and sets aside those that end (EOS among the best ``2 x beam``); it
stops when ``beam`` hypotheses have ended or at ``max_len`` bytes.  A hypothesis scores its summed
log-probability divided by its length (EOS included: fairseq's length penalty 1); the best wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Protocol, Sequence

import torch
from torch import Tensor

from search_spaces import UserError
from supernet.model import Prefill, Step

from .data import BOS, EOS, PAD, Pairs
from .model import Memory, TranslationWeights, decode, decoder_start, encode_memory


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]  # generated ids (bytes, then EOS if it ended)
    score: float  # summed log-probability
    ended: bool

    @property
    def normalized(self) -> float:
        return self.score / max(1, len(self.tokens))

    @property
    def text(self) -> bytes:
        return bytes(t for t in self.tokens if t < 256)


def spell(tokens, vocabulary=None) -> bytes:
    """The bytes generated ids spell: PAD, BOS and EOS none; a byte model's ids are the bytes, a joint subword
    vocabulary's (:class:`supernet.tokenizer.Vocabulary`) spell their tokens."""
    ids = [int(t) for t in tokens if t not in (PAD, BOS, EOS)]
    return vocabulary.decode(ids) if vocabulary is not None else bytes(t for t in ids if t < 256)


class _Decoder:
    """Next-byte log-probabilities for a batch of prefixes of one source: cached (one byte per call) or not."""

    def __init__(self, w: TranslationWeights, mem: Memory, capacity: int, cache: bool):
        self.w, self.mem, self.capacity, self.cache = w, mem, capacity, cache
        self.states: list | None = None

    def __call__(self, prefixes: Tensor) -> Tensor:
        """prefixes (B, t) (BOS first) -> log-probabilities (B, V) of the next id, PAD and BOS excluded."""
        t = prefixes.shape[1]
        if not self.cache:
            logits, _ = decode(self.w, prefixes, self.mem)
        elif self.states is None:
            logits, self.states = decode(self.w, prefixes, self.mem, 0, [Prefill(self.capacity)] * len(self.w.dec_blocks))
        else:
            pos = torch.tensor([t - 1], device=prefixes.device)
            steps = [Step(s, pos, t - 1) for s in self.states]
            logits, self.states = decode(self.w, prefixes[:, -1:], self.mem, t - 1, steps)
        lp = logits[:, -1].float().log_softmax(-1)  # (B, V)
        lp[:, PAD] = lp[:, BOS] = float("-inf")
        return lp

    def reorder(self, index: Tensor) -> None:
        """Keep the hypotheses ``index`` (B',): their caches follow them (the memory is the same for all: one source)."""
        self.mem = self.mem.select(torch.zeros_like(index)) if len(index) != self.mem.mask[0].shape[0] else self.mem
        if self.states is not None:
            self.states = [{n: t[index] for n, t in s.items()} for s in self.states]


def decode_limit(source: Sequence[int], max_seq_len: int, max_len: int | None) -> int:
    """The most ids a translation of ``source`` (bytes, or a subword vocabulary's ids: a split's pairs read at it are
    arrays) may have; an empty source, or one longer than the model reads, is refused in one line (torch's and ONNX
    Runtime's decoding alike)."""
    if len(source) == 0:
        raise UserError("the source text is empty")
    if len(source) > max_seq_len:
        unit = "bytes" if isinstance(source, (bytes, bytearray)) else "tokens"
        raise UserError(f"the source is {len(source)} {unit}; this model reads at most {max_seq_len} (its max_seq_len)")
    return max_seq_len if max_len is None else min(max_len, max_seq_len)


def _setup(w: TranslationWeights, source: bytes, max_seq_len: int, max_len: int | None, cache: bool, batch: int):
    limit = decode_limit(source, max_seq_len, max_len)
    device = w.dec_tok.device
    src = torch.tensor([list(source)], dtype=torch.long, device=device)
    mem = encode_memory(w, src)
    mem = mem.select(torch.zeros(batch, dtype=torch.long, device=device))
    return _Decoder(w, mem, limit + 1, cache), limit, device


@torch.no_grad()
def greedy(w: TranslationWeights, source: bytes, max_seq_len: int, max_len: int | None = None, cache: bool = True) -> Hypothesis:
    """The most likely byte at each step until EOS or ``max_len`` bytes."""
    dec, limit, device = _setup(w, source, max_seq_len, max_len, cache, 1)
    prefix = decoder_start(1, device)  # (1, 1)
    tokens, score = [], 0.0
    for _ in range(limit):
        lp = dec(prefix)[0]  # (V,)
        tok = int(lp.argmax())
        tokens.append(tok)
        score += float(lp[tok])
        if tok == EOS:
            return Hypothesis(tuple(tokens), score, True)
        prefix = torch.cat([prefix, torch.tensor([[tok]], device=device)], dim=1)
    return Hypothesis(tuple(tokens), score, False)


@torch.no_grad()
def beam_search(
    w: TranslationWeights, source: bytes, max_seq_len: int, beam: int = 5, max_len: int | None = None, cache: bool = True
) -> list[Hypothesis]:
    """The hypotheses found, best first (see the module doc)."""
    if beam < 1:
        raise UserError(f"--beam: {beam} is not a positive integer")
    dec, limit, device = _setup(w, source, max_seq_len, max_len, cache, 1)
    return search_beams(dec, beam, limit, device)


class NextBytes(Protocol):
    """A decoder of one source for a batch of live hypotheses: ``(prefixes (B, t), BOS first)`` -> next-id
    log-probabilities (B, V), PAD and BOS at -inf; ``reorder(index)`` keeps hypotheses ``index`` (B',)."""

    def __call__(self, prefixes: Tensor) -> Tensor: ...

    def reorder(self, index: Tensor) -> None: ...


def search_beams(dec: NextBytes, beam: int, limit: int, device: torch.device | str = "cpu") -> list[Hypothesis]:
    """Beam search (the module doc) over any decoder: torch's (:class:`_Decoder`) or ONNX Runtime's
    (:class:`tasks.translation.onnx.OnnxBeams`); the hypotheses found, best first."""
    prefixes = decoder_start(1, device)  # (B, t), one live hypothesis at first
    scores = torch.zeros(1, device=device)  # (B,)
    ended: list[Hypothesis] = []
    for t in range(limit):
        lp = dec(prefixes)  # (B, V)
        cand = (scores[:, None] + lp).flatten()  # (B * V,)
        k = min(2 * beam, int(torch.isfinite(cand).sum()))
        top, flat = cand.topk(k)
        keep_rows, keep_toks, keep_scores = [], [], []
        for s, f in zip(top.tolist(), flat.tolist()):
            row, tok = divmod(f, lp.shape[1])
            gen = tuple(prefixes[row, 1:].tolist()) + (tok,)
            if tok == EOS:
                ended.append(Hypothesis(gen, s, True))
            elif len(keep_rows) < beam:
                keep_rows.append(row)
                keep_toks.append(tok)
                keep_scores.append(s)
        if len(ended) >= beam or not keep_rows:
            break
        index = torch.tensor(keep_rows, device=device)
        dec.reorder(index)
        prefixes = torch.cat([prefixes[index], torch.tensor(keep_toks, device=device)[:, None]], dim=1)
        scores = torch.tensor(keep_scores, device=device)
        if t == limit - 1:
            ended += [Hypothesis(tuple(p[1:].tolist()), float(s), False) for p, s in zip(prefixes, scores)]
    return sorted(ended, key=lambda h: -h.normalized)


def translate(w: TranslationWeights, source: bytes, max_seq_len: int, beam: int = 1, max_len: int | None = None) -> Hypothesis:
    """The best translation of ``source``: greedy for ``beam`` 1, else beam search (cached decoding)."""
    if beam == 1:
        return greedy(w, source, max_seq_len, max_len)
    return beam_search(w, source, max_seq_len, beam, max_len)[0]


def score_translations(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """chrF and BLEU (sacrebleu's defaults: chrF with character 6-grams, BLEU with the 13a tokenizer)."""
    import sacrebleu

    return {"chrf": float(sacrebleu.corpus_chrf(hypotheses, [references]).score),
            "bleu": float(sacrebleu.corpus_bleu(hypotheses, [references]).score)}  # fmt: skip


def paired_bootstrap(baseline: list[str], system: list[str], references: list[str], samples: int = 1000) -> dict:
    """sacrebleu's paired bootstrap resampling (``sacrebleu.significance.PairedTest``, ``test_type="bs"``: Koehn 2004,
    as Moses' script) of ``system`` against ``baseline``, both translations of the same ``references`` in order:
    ``{"chrf": {"baseline", "system", "p_value"}, "bleu": {...}, "signature": {...}}``.  The p-value is two-sided (the
    absolute difference); the resamples are seeded by sacrebleu (``SACREBLEU_SEED``, default 12345)."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    if not (len(baseline) == len(system) == len(references)) or not references:
        raise ValueError(f"paired bootstrap: {len(baseline)} baseline, {len(system)} system and {len(references)} "
                         "reference sentences (the same positive number of each)")  # fmt: skip
    metrics = {"chrf": CHRF(), "bleu": BLEU()}
    test = PairedTest([("baseline", baseline), ("system", system)], metrics, [references], test_type="bs",
                      n_samples=samples)  # fmt: skip
    signatures, results = test()
    scores = [v for k, v in results.items() if k != "System"]  # one list (baseline, system) per metric, in order
    out = {name: {"baseline": float(r[0].score), "system": float(r[1].score), "p_value": float(r[1].p_value)}
           for name, r in zip(metrics, scores)}  # fmt: skip
    out["signature"] = {name: str(sig) for name, sig in zip(metrics, signatures.values())}
    return out


def evaluate_translation(
    w: TranslationWeights | Callable[[bytes], Hypothesis],
    pairs: Pairs,
    max_seq_len: int,
    beam: int = 5,
    limit: int | None = None,
    max_len: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    vocabulary=None,
) -> dict:
    """Translate the pairs of a split whose source fits (the first ``limit`` of them, in order) and score them:
    ``{"chrf", "bleu", "pairs", "skipped", "hypotheses"}``.  ``w``: the model's weights (torch, :func:`translate`
    at ``beam`` and ``max_len``), or any call source -> best hypothesis (ONNX Runtime's); ``vocabulary``: a joint
    subword vocabulary's (the pairs are its ids: it spells the hypotheses and the references)."""
    if isinstance(w, TranslationWeights):
        translate_one = partial(translate, w, max_seq_len=max_seq_len, beam=beam, max_len=max_len)
    else:
        translate_one = w

    picked, skipped = [], 0
    for i in range(len(pairs)):
        src, ref = pairs[i]
        if len(src) > max_seq_len:
            skipped += 1
            continue
        picked.append((src, ref))
        if limit is not None and len(picked) >= limit:
            break
    if not picked:
        raise UserError(f"no pair of the split has a source of at most {max_seq_len} bytes to translate")
    hyps, refs = [], []
    for n, (src, ref) in enumerate(picked, 1):
        hyps.append(spell(translate_one(src).tokens, vocabulary).decode("utf-8", errors="replace"))
        refs.append((ref if isinstance(ref, bytes) else spell(ref, vocabulary)).decode("utf-8", errors="replace"))
        if progress is not None:
            progress(n, len(picked))
    return {**score_translations(hyps, refs), "pairs": len(picked), "skipped": skipped, "hypotheses": hyps}


def translate_runner(model, workload, generator: torch.Generator | None = None) -> Callable[[], Tensor]:
    """A call that runs HAT's ``translate`` workload once on ``model`` (a static encoder-decoder): encode a random
    source of ``workload.source`` bytes, compute the cross keys / values once, then ``workload.steps`` cached
    decoder steps at batch ``workload.beam`` (each feeding every beam's most likely byte, with beam search's cache
    gather; a fixed number of steps, no early stop).  Returns the decoder inputs (beam, steps + 1): what latency
    devices will time."""
    w = model.weights()
    b, n = workload.beam, workload.steps
    src = torch.randint(0, 256, (1, workload.source), generator=generator).to(w.dec_tok.device)  # (1, S)
    order = torch.arange(b, device=w.dec_tok.device)

    @torch.no_grad()
    def run() -> Tensor:
        mem = encode_memory(w, src).select(torch.zeros(b, dtype=torch.long, device=src.device))
        dec = _Decoder(w, mem, n + 1, cache=True)
        prefix = decoder_start(b, src.device)  # (B, 1)
        for _ in range(n):
            tok = dec(prefix).argmax(-1, keepdim=True)  # (B, 1)
            dec.reorder(order)
            prefix = torch.cat([prefix, tok], dim=1)
        return prefix

    return run

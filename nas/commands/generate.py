"""``nas generate``: sample text from an exported model."""

from __future__ import annotations

import argparse
from .registry import register_command

NAME = "generate"
HELP = "sample text from a model written by `nas export` (prefill once, then one cached decode step per token)"
EXAMPLE = 'nas generate --model runs/export --prompt "def main(" --max-new-tokens 200'


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a directory written by `nas export`")
    p.add_argument("--prompt", default="", help="text to continue (read by the model's tokenizer.json)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate (bytes for a byte model; default 200)")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="sample among the k most likely tokens (default 40; 0 = all)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument(
        "--overflow",
        choices=("reprefill", "slide", "continue"),
        default="reprefill",
        help="once the context fills max_seq_len: 'reprefill' re-reads the last --keep tokens into a fresh cache "
        "(default); 'slide' runs the whole model on the last max_seq_len tokens per token (slow, the uncached "
        "sliding window); 'continue' decodes on past max_seq_len (rotary models without cosformer layers)",
    )
    p.add_argument("--keep", type=int, default=None, help="tokens a re-prefill keeps (default max_seq_len // 2)")


def run(args: argparse.Namespace) -> int:
    import sys

    import torch

    from search_spaces import UserError
    from supernet.artifact import load_model, load_vocabulary
    from supernet.generate import generate

    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens: {args.max_new_tokens}; expected a positive count")
    if args.temperature < 0:
        raise UserError(f"--temperature: {args.temperature}; expected >= 0 (0 = greedy)")
    if args.top_k < 0:
        raise UserError(f"--top-k: {args.top_k}; expected >= 0 (0 = no limit)")
    model = load_model(args.model)
    vocab = load_vocabulary(args.model)  # the folder's tokenizer.json: the model loads and runs from its folder alone
    text = generate(
        model,
        args.prompt.encode("utf-8"),
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k or None,
        generator=torch.Generator().manual_seed(args.seed),
        overflow=args.overflow,
        keep=args.keep,
        vocabulary=vocab,
    )
    sys.stdout.write(args.prompt + text.decode("utf-8", errors="replace") + "\n")
    return 0


register_command(__name__)

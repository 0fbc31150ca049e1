"""`alpamayo generate`: chat-templated greedy text generation from a checkpoint."""

from __future__ import annotations

import argparse
import json

import torch

from alpamayo.commands.common import add_model_args, text_model
from alpamayo.config import load_config
from alpamayo.generation import greedy_continue
from alpamayo.tokenizer import chat_prompt_ids, load_tokenizer


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="greedy chat generation from a text prompt")
    add_model_args(p)
    p.add_argument("--prompt", required=True, help="user message")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--json", action="store_true", help="print one JSON object: prompt_token_ids, token_ids, text"
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    cfg = load_config(args.checkpoint)
    tokenizer = load_tokenizer(args.checkpoint)
    prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": args.prompt}])
    with text_model(args, cfg, len(prompt) + args.max_new_tokens) as model:
        logits = model.prefill(torch.tensor(prompt))
        tokens = greedy_continue(model, logits, args.max_new_tokens, cfg.eos_token_ids)
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    if args.json:
        print(json.dumps({"prompt_token_ids": prompt, "token_ids": tokens, "text": text}))
    else:
        print(text)
    return 0

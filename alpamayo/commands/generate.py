"""`alpamayo generate`: chat-templated greedy generation from a text prompt and optional images."""

from __future__ import annotations

import argparse
import json

import torch
from PIL import Image

from alpamayo.commands.common import add_model_args, model_spec, text_model
from alpamayo.config.loader import load_model_config, model_tokenizer
from alpamayo.config.model import ModelConfig
from alpamayo.generation import greedy_continue
from alpamayo.tokenizer import chat_prompt_ids
from alpamayo.vlm import VisionLanguageModel


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="greedy chat generation from a text prompt and optional images")
    add_model_args(p, decoding=False)  # the text backbone and vision tower only
    p.add_argument("--prompt", required=True, help="user message")
    p.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="image file, repeatable; the images come first in the user message, in the order given",
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--json", action="store_true", help="print one JSON object: prompt_token_ids, token_ids, text"
    )
    p.set_defaults(handler=run)


def load_images(paths: list[str]) -> list[Image.Image]:
    images = []
    for path in paths:
        try:
            with Image.open(path) as image:
                image.load()
                images.append(image)
        except OSError as e:  # missing file, unreadable or not an image (PIL's UnidentifiedImageError)
            raise ValueError(f"--image {path}: cannot read the image ({e})") from e
    return images


def cache_length(cfg: ModelConfig, prompt_len: int, max_new_tokens: int) -> int:
    """KV-cache positions for the prompt and every new token, refused past the model's position range (a
    too-large --max-new-tokens otherwise failed allocating the cache, with torch's traceback)."""
    limit = cfg.text.max_position_embeddings
    if prompt_len + max_new_tokens > limit:
        raise ValueError(
            f"--max-new-tokens {max_new_tokens}: the {prompt_len}-token prompt leaves room for at most "
            f"{limit - prompt_len} new tokens (max_position_embeddings = {limit})"
        )
    return prompt_len + max_new_tokens


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    images = load_images(args.image)
    cfg = load_model_config(args.checkpoint, args.base_model)
    tokenizer = model_tokenizer(cfg)
    if images:
        content = [{"type": "image"} for _ in images] + [{"type": "text", "text": args.prompt}]
        with VisionLanguageModel.from_checkpoint(args.checkpoint, model_spec(args).options, cfg=cfg) as model:
            features = model.encode_images(images)
            prompt = model.expand_image_pads(
                chat_prompt_ids(tokenizer, [{"role": "user", "content": content}]), features
            )
            model.setup_cache(cache_length(cfg, len(prompt), args.max_new_tokens))
            logits = model.prefill(prompt, features)
            tokens = greedy_continue(model, logits, args.max_new_tokens, cfg.eos_token_ids)
    else:
        prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": args.prompt}])
        with text_model(args, cfg, cache_length(cfg, len(prompt), args.max_new_tokens)) as model:
            logits = model.prefill(torch.tensor(prompt))
            tokens = greedy_continue(model, logits, args.max_new_tokens, cfg.eos_token_ids)
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    if args.json:
        print(json.dumps({"prompt_token_ids": prompt, "token_ids": tokens, "text": text}))
    else:
        print(text)
    return 0

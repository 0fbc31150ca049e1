"""Checks and conversions of prefill/decode arguments shared by every backend (torch and ttnn).

Each error names the offending value and the allowed shape or range.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from alpamayo.config.model import TextConfig


def check_token_ids(ids: torch.Tensor, vocab: int) -> None:
    """Refuse token ids [...] outside the embedding table [0, vocab), naming the range found."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"token ids must be in [0, {vocab}), got range [{int(ids.min())}, {int(ids.max())}]")


def prompt_hidden(
    cfg: TextConfig, inputs: torch.Tensor, embed: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """Prompt embeddings [L, H]: `embed(ids)` for token ids [L], the tensor itself for embeddings [L, H]."""
    h = inputs if inputs.is_floating_point() else embed(inputs)
    if h.dim() != 2 or h.shape[1] != cfg.hidden_size:
        raise ValueError(
            f"prefill inputs must be ids [L] or embeddings [L, {cfg.hidden_size}], got shape {list(inputs.shape)}"
        )
    return h


def check_prefill(
    cfg: TextConfig,
    length: int,
    max_seq_len: int,
    position_ids: torch.Tensor | None,
    visual_pos_mask: torch.Tensor | None,
    deepstack: Sequence[torch.Tensor] | None,
) -> torch.Tensor:
    """Validate a prompt's arguments; returns its M-RoPE position ids [3, L] (arange rows when omitted)."""
    if not 1 <= length <= max_seq_len:
        raise ValueError(f"prompt length {length} must be in [1, max_seq_len={max_seq_len}]")
    if position_ids is None:
        position_ids = text_position_ids(length)
    if tuple(position_ids.shape) != (3, length):
        raise ValueError(f"position_ids must have shape [3, {length}], got {list(position_ids.shape)}")
    if deepstack is None or len(deepstack) == 0:
        return position_ids
    if (
        visual_pos_mask is None
        or visual_pos_mask.dtype != torch.bool
        or tuple(visual_pos_mask.shape) != (length,)
    ):
        raise ValueError(f"deepstack features need visual_pos_mask as a bool tensor [{length}]")
    if len(deepstack) > cfg.num_hidden_layers:
        raise ValueError(f"{len(deepstack)} deepstack levels for {cfg.num_hidden_layers} decoder layers")
    n = int(visual_pos_mask.sum())
    for k, feats in enumerate(deepstack):
        if tuple(feats.shape) != (n, cfg.hidden_size):
            raise ValueError(
                f"deepstack[{k}] has shape {list(feats.shape)}, expected [{n}, {cfg.hidden_size}] "
                f"({n} visual positions)"
            )
    return position_ids


def check_decode_room(cache_len: int, max_seq_len: int, tokens: int = 1) -> None:
    """RuntimeError unless a decode step of `tokens` per row can run: a prompt was prefilled and the cache has
    that many free positions."""
    if cache_len == 0:
        raise RuntimeError("decode() needs a prefilled prompt")
    if cache_len + tokens > max_seq_len:
        raise RuntimeError(
            f"KV cache full: {cache_len} positions of max_seq_len={max_seq_len}, {tokens} more requested"
        )


def text_position_ids(length: int) -> torch.Tensor:
    """M-RoPE position ids [3, L] int64 of a text-only prompt: 0..L-1 on all three rows (T, H, W)."""
    return torch.arange(length).repeat(3, 1)


def rope_delta(position_ids: torch.Tensor) -> int:
    """transformers' decode offset: token `cache_len` of the continuation sits at `cache_len + rope_delta`."""
    return int(position_ids.max()) + 1 - position_ids.shape[1]

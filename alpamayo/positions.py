"""Layout of images in a multimodal prompt: image-pad expansion and Qwen3-VL's 3-row M-RoPE position ids.

A prompt holds each image as `<|vision_start|><|image_pad|>...<|image_pad|><|vision_end|>` with one pad per
language-model token of that image (t * h * w / merge^2 for grid (t, h, w)). Positions (transformers'
`get_rope_index`):
  * text tokens (vision_start/end included) count up by one on all three rows (T, H, W);
  * the tokens of an image starting at position s, enumerated over its (t, h/merge, w/merge) token grid in
    row-major order, get T = s + frame, H = s + row, W = s + col;
  * the text after an image resumes at s + max(h, w) / merge.
`rope_delta = max(position) + 1 - L` (<= 0) shifts every decoded token: token i of the continuation sits at
L + i + rope_delta on all three rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from alpamayo.config.model import ModelConfig
from alpamayo.text.inputs import rope_delta, text_position_ids


def _image_ids(cfg: ModelConfig) -> tuple[int, int]:
    if cfg.image_token_id is None or cfg.vision is None:
        raise ValueError(
            f"{cfg.source}: the config has no image_token_id / vision_config; images are unsupported"
        )
    return cfg.image_token_id, cfg.vision.spatial_merge_size


def image_token_counts(grid_thw: torch.Tensor, merge: int) -> list[int]:
    """grid_thw [n, 3] (patches) -> language-model tokens per image, t * h * w / merge^2."""
    return (grid_thw.prod(-1) // merge**2).tolist()


def expand_image_pads(input_ids: Sequence[int], grid_thw: torch.Tensor, cfg: ModelConfig) -> list[int]:
    """Replace the k-th `<|image_pad|>` of a prompt with as many pads as image k has tokens.

    input_ids hold exactly one pad per image (as a chat template renders it); grid_thw [n_images, 3].
    """
    pad, merge = _image_ids(cfg)
    counts = image_token_counts(grid_thw, merge)
    found = sum(1 for t in input_ids if t == pad)
    if found != len(counts):
        raise ValueError(
            f"the prompt has {found} <|image_pad|> token(s) (id {pad}) for {len(counts)} image(s)"
        )
    out: list[int] = []
    images = iter(counts)
    for t in input_ids:
        out.extend([pad] * next(images) if t == pad else [int(t)])
    return out


def mrope_position_ids(
    input_ids: torch.Tensor, image_grid_thw: torch.Tensor | None, cfg: ModelConfig
) -> tuple[torch.Tensor, int]:
    """input_ids [L] with expanded image pads, image_grid_thw [n_images, 3] (or None for text only) ->
    (position_ids [3, L] int64, rope_delta int)."""
    ids = torch.as_tensor(input_ids).reshape(-1).cpu()
    length = ids.numel()
    if cfg.video_token_id is not None and bool((ids == cfg.video_token_id).any()):
        raise ValueError(
            f"the prompt holds <|video_pad|> tokens (id {cfg.video_token_id}); video is unsupported"
        )
    grids = torch.zeros(0, 3, dtype=torch.long) if image_grid_thw is None else image_grid_thw.cpu().long()
    if grids.numel() == 0:
        if cfg.image_token_id is not None and bool((ids == cfg.image_token_id).any()):
            raise ValueError(
                f"the prompt holds <|image_pad|> tokens (id {cfg.image_token_id}) but no image grids"
            )
        return text_position_ids(length), 0
    pad, merge = _image_ids(cfg)
    counts = image_token_counts(grids, merge)
    pads = (ids == pad).nonzero().flatten().tolist()
    if len(pads) != sum(counts):
        raise ValueError(
            f"the prompt has {len(pads)} <|image_pad|> tokens but the {len(counts)} image grid(s) "
            f"{grids.tolist()} need {sum(counts)} ({counts})"
        )
    positions = torch.empty(3, length, dtype=torch.long)
    cursor = next_pos = used = 0  # next token index, next position, pads consumed
    for i, ((t, h, w), n) in enumerate(zip(grids.tolist(), counts, strict=True)):
        first = pads[used]
        if pads[used + n - 1] != first + n - 1:
            raise ValueError(f"image {i} needs {n} consecutive <|image_pad|> tokens from index {first}")
        positions[:, cursor:first] = torch.arange(first - cursor) + next_pos
        next_pos += first - cursor
        gh, gw = h // merge, w // merge
        frame, row, col = torch.meshgrid(torch.arange(t), torch.arange(gh), torch.arange(gw), indexing="ij")
        positions[:, first : first + n] = torch.stack([frame, row, col]).reshape(3, n) + next_pos
        next_pos += max(gh, gw)
        cursor, used = first + n, used + n
    positions[:, cursor:] = torch.arange(length - cursor) + next_pos
    return positions, rope_delta(positions)

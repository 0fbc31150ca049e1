"""Torch reference Qwen3-VL vision tower with DeepStack (the oracle for the ttnn backend).

    encoder = VisionEncoder.from_checkpoint(ckpt_dir, dtype=torch.bfloat16)
    embeds, deepstack = encoder.encode(pixel_values, grid_thw)

pixel_values [N, 3 * T * P * P] and grid_thw [n_images, 3] come from `vision.preprocess`. The forward:
patch embedding (a matmul), plus the learned position table resampled to each image grid; depth pre-LN
blocks with 2-D rotary attention inside each image frame only; after each block listed in
`deepstack_visual_indexes` a DeepStack merger turns the hidden states into language-model features; after
the last block the main merger gives the image embeddings. Every merger fuses merge^2 = 4 patches per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from alpamayo.checkpoint import Checkpoint, Getter, open_checkpoint
from alpamayo.config.model import ModelConfig, VisionConfig
from alpamayo.profiling.tracer import Tracer
from alpamayo.quant import PART_NAMES, QuantRecipe
from alpamayo.quant.cache import PackedWeightCache
from alpamayo.text.linear import Linear, pack_linears
from vision.block import PatchMerger, VisionBlock
from vision.positions import learned_position_embeds, patch_rows_cols, rotary_cos_sin
from vision.weights import (
    MERGER,
    POS_EMBED,
    build_block,
    build_merger,
    build_patch_embed,
    deepstack_prefix,
    validate_vision_tensors,
)


class VisionEncoder(nn.Module):
    """Patch embedding, position information, blocks, main merger and DeepStack mergers."""

    def __init__(
        self,
        cfg: VisionConfig,
        patch_embed: Linear,
        pos_table: torch.Tensor,
        blocks: Sequence[VisionBlock],
        merger: PatchMerger,
        deepstack_mergers: Sequence[PatchMerger],
    ):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = patch_embed
        self.pos_table = pos_table  # [num_position_embeddings, C], a square grid
        self.blocks = nn.ModuleList(blocks)
        self.merger = merger
        self.deepstack_mergers = nn.ModuleList(deepstack_mergers)
        self.dtype, self.device = pos_table.dtype, pos_table.device

    @classmethod
    def from_checkpoint(
        cls,
        source: str | Path | Checkpoint,
        cfg: ModelConfig | None = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        quant: QuantRecipe | None = None,
        quant_cache: PackedWeightCache | None = None,
    ) -> VisionEncoder:
        """Build from a checkpoint directory (or an open `Checkpoint`), validating every `visual.*` tensor first;
        `quant`: weight-only quantisation of the linears at load (see `alpamayo.quant`), through `quant_cache`
        when given."""
        ckpt, cfg = open_checkpoint(source, cfg)
        v = validate_vision_tensors(ckpt, cfg)
        return cls.from_weights(v, ckpt.getter(dtype, device), quant, quant_cache)

    @classmethod
    def from_weights(
        cls,
        v: VisionConfig,
        get: Getter,
        quant: QuantRecipe | None = None,
        quant_cache: PackedWeightCache | None = None,
    ) -> VisionEncoder:
        """Build from tensors by canonical name (`get(name)`, in the model's dtype and device; not validated:
        `from_checkpoint` validates first), the linears packed (quantised by `quant` where it applies, through
        `quant_cache` when given)."""
        encoder = cls(
            v,
            build_patch_embed(v, get),
            get(POS_EMBED),
            [build_block(v, j, get) for j in range(v.depth)],
            build_merger(MERGER, False, get),
            [build_merger(deepstack_prefix(k), True, get) for k in range(len(v.deepstack_visual_indexes))],
        )
        pack_linears(encoder, quant=quant, cache=quant_cache, part=PART_NAMES["vision"])
        return encoder.eval()

    @torch.inference_mode()
    def encode(
        self, pixel_values: torch.Tensor, grid_thw: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """pixel_values [N, patch_dim], grid_thw [n, 3] -> (image embeds [N/4, out_hidden], DeepStack features:
        one [N/4, out_hidden] per entry of deepstack_visual_indexes, in block order), in the model dtype.

        Each image frame (t step of an image) attends only to itself, so encoding an image alone or among
        others gives the same features.
        """
        check_inputs(self.cfg, pixel_values, grid_thw)
        v = self.cfg
        grid_thw = grid_thw.cpu()
        rows, cols = patch_rows_cols(grid_thw, v.spatial_merge_size)
        x = self.patch_embed(pixel_values.to(self.device, self.dtype))
        x = x + learned_position_embeds(self.pos_table, grid_thw, rows, cols).to(self.device, self.dtype)
        cos, sin = (t.to(self.device) for t in rotary_cos_sin(rows, cols, v.head_dim, v.rope_theta))
        segments = frame_segments(grid_thw)
        deepstack = []
        for j, block in enumerate(self.blocks):
            x = block(x, cos, sin, segments)
            if j in v.deepstack_visual_indexes:
                deepstack.append(self.deepstack_mergers[v.deepstack_visual_indexes.index(j)](x))
        return self.merger(x), deepstack

    def trace_into(self, tracer: Tracer) -> None:
        """The torch tower has no stages finer than the runtime's `vision` span: nothing to record."""

    def close(self) -> None:
        """The torch tower holds nothing but host or CUDA tensors, which go with the model: nothing to release."""


def check_inputs(v: VisionConfig, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> None:
    """Refuse a patch grid or pixel tensor the tower cannot encode, naming the offending value."""
    if (
        grid_thw.dim() != 2
        or grid_thw.shape[1] != 3
        or grid_thw.shape[0] == 0
        or grid_thw.is_floating_point()
    ):
        raise ValueError(
            f"grid_thw must be integer [n_images >= 1, 3], got {grid_thw.dtype} {list(grid_thw.shape)}"
        )
    m = v.spatial_merge_size
    for i, (t, h, w) in enumerate(grid_thw.tolist()):
        if min(t, h, w) < 1 or h % m or w % m:
            raise ValueError(
                f"grid_thw[{i}] = {[t, h, w]}: t, h, w must be >= 1 and h, w multiples of the merge size {m}"
            )
    n = int(grid_thw.prod(-1).sum())
    if tuple(pixel_values.shape) != (n, v.patch_dim):
        raise ValueError(
            f"pixel_values must have shape [{n}, {v.patch_dim}] for grid_thw {grid_thw.tolist()}, "
            f"got {list(pixel_values.shape)}"
        )


def frame_segments(grid_thw: torch.Tensor) -> list[int]:
    """Patch rows of each attention segment: one per image frame (t step), in order."""
    return torch.repeat_interleave(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0]).tolist()

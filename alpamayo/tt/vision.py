"""The Qwen3-VL vision tower on one Blackhole p150, behind the interface of `vision.encoder.VisionEncoder`:

    encoder = TTVisionEncoder.from_checkpoint(ckpt, cfg, precision="performance", device=text_model.device)
    embeds, deepstack = encoder.encode(pixel_values, grid_thw)   # [N/4, out_hidden], one per DeepStack level

Host (as tt-metal's Qwen-VL demos): input checks, the patch rows (`vision.preprocess` order), the learned
position table resampled to each image grid (`vision.positions`), the 2-D rotary tables and the attention
windows. Device: the patch-embedding matmul (+ bias + positions), every block and every merger.

Layout: all patches of the call are one `[1, 1, N_p, C]` sequence, N padded to a multiple of 128 (the padding
rows form their own attention window, so no real row attends to them). Attention heads are `padded_head_dim`
lanes wide (`alpamayo.plan.weights`: split-half layout, zero q/k/v lanes and zero output-projection rows, so
padding cannot leak; cos/sin are laid out the same way). Attention is windowed SDPA with one window per image
frame (`cu_window_seqlens`, the block-diagonal mask built on the device): no image attends to another, as in
the torch reference's per-segment attention. Mergers fuse 4 consecutive rows through a row-major reshape (a
tilized reshape can hang, tt-metal#29932) and run on all N_p / 4 rows; rows past N / 4 are dropped on the
host. Outputs come back to the host as bf16 `[N/4, out_hidden]`, the form the runtime caches per frame and
the text prefill (torch or ttnn) consumes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from alpamayo.checkpoint import Checkpoint, open_checkpoint
from alpamayo.config.model import ModelConfig, VisionConfig
from alpamayo.plan.device_spec import DeviceSpec
from alpamayo.plan.precision import Precision, load_precision
from alpamayo.plan.programs.vision import VISION_GELU, VISION_SDPA_CHUNK, VisionPlan, plan_vision
from alpamayo.plan.vision_weights import vision_weight_specs
from alpamayo.plan.weights import head_positions
from alpamayo.profiling import Tracer
from alpamayo.tt import ttnn_configs as cfgs
from alpamayo.tt.device import ttnn_for
from alpamayo.tt.device_io import DeviceIO, DeviceTensor, TensorGroup
from alpamayo.tt.weight_cache import NamedTensors, upload_weights
from vision.block import LAYER_NORM_EPS
from vision.encoder import check_inputs, frame_segments
from vision.positions import learned_position_embeds, patch_rows_cols, rotary_cos_sin
from vision.weights import POS_EMBED, validate_vision_tensors


def padded_rotary(
    rows: torch.Tensor, cols: torch.Tensor, cfg: VisionConfig, padded: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The 2-D rotary tables cos, sin [N, padded] float32 in the device's head layout: the reference angles
    (`vision.positions.rotary_cos_sin`) at the lanes of `head_positions`, cos 1 and sin 0 elsewhere (those lanes
    of q and k are zero, so any angle would do)."""
    cos, sin = rotary_cos_sin(rows, cols, cfg.head_dim, cfg.rope_theta)
    lanes = head_positions(cfg.head_dim, padded)
    cos_p, sin_p = torch.ones(rows.numel(), padded), torch.zeros(rows.numel(), padded)
    cos_p[:, lanes], sin_p[:, lanes] = cos, sin
    return cos_p, sin_p


@dataclass
class ImageInputs(TensorGroup):
    """What every block of one `encode` call reads besides x, on the device: the rotary tables cos and sin
    [1, 1, N_p, padded_head_dim] bf16 (`padded_rotary`), the attention windows' bounds [frames + 1 (+ 1 with
    padding rows)] int32 row-major (`cu_window_seqlens`) and the resampled position embeddings
    [1, 1, N_p, C] bf16 (added after the patch embedding)."""

    cos: DeviceTensor
    sin: DeviceTensor
    windows: DeviceTensor
    pos: DeviceTensor


@dataclass
class VisionKernels:
    """The tower's compute-kernel configs: its matmuls', its LayerNorms' and its SDPA's."""

    matmul: Any
    norm: Any
    sdpa: Any


class TTVisionEncoder(DeviceIO):
    """Device weights and forward of the vision tower (see module docstring). `device` belongs to the caller."""

    def __init__(
        self,
        cfg: VisionConfig,
        precision: Precision,
        plan: VisionPlan,
        device: Any,
        weights: NamedTensors,
        pos_table: torch.Tensor,
        tracer: Tracer | None = None,
    ):
        self.ttnn = ttnn = ttnn_for(device)
        self.cfg, self.precision, self.plan, self.device = cfg, precision, plan, device
        self.w: NamedTensors = weights  # `vision_weight_specs` name -> device tensor
        self.pos_table = pos_table  # [num_position_embeddings, C] float32, host
        self.tracer = tracer or Tracer(enabled=False)
        self.ck = VisionKernels(
            matmul=cfgs.compute_config(ttnn, precision.math_fidelity("vision")),
            norm=cfgs.compute_config(ttnn, precision.math_fidelity("norm"), l1_acc=False),
            # fp32 accumulation in a long prefill SDPA overflows L1 (text prefill, measured at ~4.6K rows)
            sdpa=cfgs.compute_config(ttnn, precision.math_fidelity("sdpa"), fp32_acc=False, l1_acc=False),
        )
        self.block_gelu = getattr(ttnn.GeluVariant, VISION_GELU[cfg.hidden_act])  # checked by `plan_vision`

    @classmethod
    def from_checkpoint(
        cls,
        source: str | Path | Checkpoint,
        cfg: ModelConfig | None = None,
        precision: str | Precision = "performance",
        device: Any = None,
        cache_dir: str | Path | None = None,
        tracer: Tracer | None = None,
    ) -> TTVisionEncoder:
        """Validate the `visual.*` tensors, plan, and upload every vision weight to the opened `device`
        (the text model's: `TTTextModel.device`). `cache_dir` as in `TTTextModel.from_checkpoint`."""
        ckpt, cfg = open_checkpoint(source, cfg)
        v = validate_vision_tensors(ckpt, cfg)
        if device is None:
            raise ValueError("TTVisionEncoder needs an opened device (the text model's `device`)")
        precision = load_precision(precision)
        spec = DeviceSpec.from_device(device)
        plan = plan_vision(v, spec, cfg.source)
        weights = upload_weights(
            vision_weight_specs(v), precision, device, ckpt.get, cache_dir, spec.dram_banks
        )
        return cls(v, precision, plan, device, weights, ckpt.get(POS_EMBED, torch.float32), tracer)

    def trace_into(self, tracer: Tracer) -> None:
        """Time the device forward (`tt.vision`) as spans of `tracer`."""
        self.tracer = tracer

    def close(self) -> None:
        """Free the device weights (the device itself belongs to the text model)."""
        self.free(*self.w.values())
        self.w = {}

    # ------------------------------------------------------------------ host <-> device
    def _fetch(self, t: Any, rows: int, cols: int) -> torch.Tensor:
        """Rows [:rows, :cols] of a [1, 1, R, C] device tensor (freed) as bf16 on the host."""
        out = self.download(t)[0, 0, :rows, :cols].to(torch.bfloat16)
        self.free(t)
        return out

    @contextmanager
    def _inputs(self, grid_thw: torch.Tensor) -> Iterator[ImageInputs]:
        """Device cos, sin [1, 1, N_p, lanes] and the windows of the patches of `grid_thw`; freed on exit."""
        v, p = self.cfg, self.plan
        grid_thw = grid_thw.cpu()
        rows, cols = patch_rows_cols(grid_thw, v.spatial_merge_size)
        n = rows.numel()
        padded = p.padded_length(n)
        cos_p, sin_p = padded_rotary(rows, cols, v, p.padded_head_dim)
        bounds = torch.tensor([0, *frame_segments(grid_thw)]).cumsum(0).tolist()
        if padded > n:
            bounds.append(padded)  # the padding rows: a window of their own
        ttnn = self.ttnn
        dev = ImageInputs(
            cos=self.upload_rows(cos_p, padded, p.padded_head_dim),
            sin=self.upload_rows(sin_p, padded, p.padded_head_dim),
            windows=self.upload(torch.tensor(bounds, dtype=torch.int32), ttnn.int32, ttnn.ROW_MAJOR_LAYOUT),
            pos=self.upload_rows(
                learned_position_embeds(self.pos_table, grid_thw, rows, cols), padded, v.hidden_size
            ),
        )
        try:
            yield dev
        finally:
            self.free(*dev.tensors())

    # ------------------------------------------------------------------ device ops
    def _linear(self, x: Any, name: str) -> Any:
        """x [1, 1, M, K] @ weight `name` [K, N] + its bias -> [1, 1, M, N] bf16 DRAM (minimal_matmul, 11x10)."""
        ttnn, w = self.ttnn, self.w[name]
        mm = self.plan.matmul(x.shape[-2], w.shape[-2], w.shape[-1])
        return ttnn.experimental.minimal_matmul(
            x,
            w,
            bias_tensor=self.w[name + ".bias"],
            config=cfgs.prefill_matmul(ttnn, mm),
            compute_kernel_config=self.ck.matmul,
            dtype=ttnn.bfloat16,
            memory_config=ttnn.DRAM_MEMORY_CONFIG,
        )

    def _norm(self, x: Any, name: str) -> Any:
        return self.ttnn.layer_norm(
            x,
            epsilon=LAYER_NORM_EPS,
            weight=self.w[name + ".weight"],
            bias=self.w[name + ".bias"],
            compute_kernel_config=self.ck.norm,
            memory_config=self.ttnn.DRAM_MEMORY_CONFIG,
        )

    def _mlp(self, x: Any, prefix: str, variant: Any) -> Any:
        """fc2(gelu(fc1(x))) with biases; x kept."""
        h = self._linear(x, prefix + "fc1")
        g = self.ttnn.gelu(h, variant=variant, memory_config=self.ttnn.DRAM_MEMORY_CONFIG)
        self.free(h)
        out = self._linear(g, prefix + "fc2")
        self.free(g)
        return out

    def _attention(self, x: Any, j: int, inputs: ImageInputs) -> Any:
        """Windowed self-attention of block j on the normed x [1, 1, N_p, C] (kept) -> [1, 1, N_p, C]."""
        ttnn, v, p = self.ttnn, self.cfg, f"vision.blocks.{j}.attn."
        qkv = self._linear(x, p + "qkv")
        q, k, val = ttnn.experimental.nlp_create_qkv_heads(
            qkv,
            num_heads=v.num_heads,
            num_kv_heads=v.num_heads,
            transpose_k_heads=False,
            memory_config=ttnn.DRAM_MEMORY_CONFIG,
        )
        self.free(qkv)
        qr = ttnn.experimental.rotary_embedding_hf(q, inputs.cos, inputs.sin, is_decode_mode=False)
        kr = ttnn.experimental.rotary_embedding_hf(k, inputs.cos, inputs.sin, is_decode_mode=False)
        self.free(q, k)
        a = ttnn.transformer.scaled_dot_product_attention(
            qr,
            kr,
            val,
            is_causal=False,
            scale=v.head_dim**-0.5,
            cu_window_seqlens=inputs.windows,
            program_config=cfgs.sdpa(ttnn, self.plan.grid, VISION_SDPA_CHUNK, VISION_SDPA_CHUNK),
            compute_kernel_config=self.ck.sdpa,
        )
        self.free(qr, kr, val)
        heads = ttnn.experimental.nlp_concat_heads(a, memory_config=ttnn.DRAM_MEMORY_CONFIG)
        self.free(a)
        out = self._linear(heads, p + "proj")
        self.free(heads)
        return out

    def _residual(self, x: Any, branch: Any) -> Any:
        out = self.ttnn.add(x, branch, memory_config=self.ttnn.DRAM_MEMORY_CONFIG)
        self.free(x, branch)
        return out

    def _block(self, j: int, x: Any, inputs: ImageInputs) -> Any:
        """x = x + attn(norm1(x)); x = x + mlp(norm2(x)); x [1, 1, N_p, C] (freed)."""
        p = f"vision.blocks.{j}."
        n1 = self._norm(x, p + "norm1")
        x = self._residual(x, self._attention(n1, j, inputs))
        self.free(n1)
        n2 = self._norm(x, p + "norm2")
        x = self._residual(x, self._mlp(n2, p + "mlp.", self.block_gelu))
        self.free(n2)
        return x

    def _fuse(self, x: Any) -> Any:
        """[1, 1, N_p, W] -> [1, 1, N_p / m^2, m^2 W]: each run of m^2 rows as one row (row-major reshape)."""
        ttnn = self.ttnn
        flat = ttnn.to_layout(x, ttnn.ROW_MAJOR_LAYOUT)
        fused = ttnn.reshape(flat, (1, 1, -1, x.shape[-1] * self.cfg.spatial_merge_size**2))
        self.free(flat)
        out = ttnn.to_layout(fused, ttnn.TILE_LAYOUT)
        self.free(fused)
        return out

    def _merger(self, x: Any, name: str, post_shuffle_norm: bool) -> Any:
        """A patch merger on x [1, 1, N_p, C] (kept) -> [1, 1, N_p / 4, out_hidden]."""
        if post_shuffle_norm:  # DeepStack: fuse, then normalise the fused row
            fused = self._fuse(x)
            normed = self._norm(fused, name + ".norm")
            self.free(fused)
        else:  # main merger: normalise each patch, then fuse
            n = self._norm(x, name + ".norm")
            normed = self._fuse(n)
            self.free(n)
        out = self._mlp(normed, name + ".", self.ttnn.GeluVariant.Accurate)  # exact (erf) GELU
        self.free(normed)
        return out

    def _embed(self, pixel_values: torch.Tensor, inputs: ImageInputs, padded: int) -> Any:
        """Patch embedding (a matmul + bias) plus the resampled position embeddings -> [1, 1, N_p, C]."""
        pix = self.upload_rows(pixel_values, padded, self.cfg.patch_dim)
        x = self._linear(pix, "vision.patch_embed")
        self.free(pix)
        out = self.ttnn.add(x, inputs.pos, memory_config=self.ttnn.DRAM_MEMORY_CONFIG)
        self.free(x)
        return out

    # ------------------------------------------------------------------ public
    @torch.inference_mode()
    def encode(
        self, pixel_values: torch.Tensor, grid_thw: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """pixel_values [N, patch_dim], grid_thw [n, 3] -> (image embeds [N/4, out_hidden] bf16, DeepStack
        features: one [N/4, out_hidden] bf16 per entry of deepstack_visual_indexes, in block order)."""
        v = self.cfg
        check_inputs(v, pixel_values, grid_thw)
        n = pixel_values.shape[0]
        padded = self.plan.padded_length(n)
        merged, out = n // v.spatial_merge_size**2, v.out_hidden_size
        with self.tracer.span("tt.vision", patches=n, rows=padded), self._inputs(grid_thw) as inputs:
            x = self._embed(pixel_values, inputs, padded)
            deepstack = []
            for j in range(v.depth):
                x = self._block(j, x, inputs)
                if j in v.deepstack_visual_indexes:
                    k = v.deepstack_visual_indexes.index(j)
                    deepstack.append(self._fetch(self._merger(x, f"vision.deepstack.{k}", True), merged, out))
            embeds = self._fetch(self._merger(x, "vision.merger", False), merged, out)
            self.free(x)
        return embeds, deepstack

"""Tiny random Qwen3-VL text configs whose dimensions the ttnn backend can place on a Blackhole p150.

Device constraints (see `alpamayo.tt.program_config`): head_dim 32 or a multiple of 64 (device rotary), hidden
and the fused QKV width multiples of 256 (32 x 8 DRAM banks). The intermediate size and vocabulary are
deliberately not, so the zero padding of the MLP and the lm_head is exercised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from alpamayo.checkpoint import Checkpoint
from alpamayo.config import load_config
from alpamayo.text.weights import EMBED
from alpamayo.tt.precision import Precision
from alpamayo.tt.weight_cache import to_host_tensor
from alpamayo.tt.weights import text_weight_specs
from tests.hf_checkpoints import save_checkpoint, text_config

REAL_ROPE = {"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [24, 20, 20]}

TT_TINY = {
    # GQA 2:1, real head_dim and M-RoPE sections, intermediate 640 (padded to 768), vocab 317 (padded to 320)
    "gqa2": dict(
        text=text_config(
            vocab_size=317,
            hidden_size=256,
            intermediate_size=640,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=128,
            rope_parameters=REAL_ROPE,
        ),
        tie=False,
    ),
    # GQA 8:1 as in Qwen3-VL-32B, tied head, hidden 512 over a 16-core residual grid
    "gqa8-tied": dict(
        text=text_config(
            vocab_size=300,
            hidden_size=512,
            intermediate_size=768,
            num_hidden_layers=3,
            num_attention_heads=8,
            num_key_value_heads=1,
            head_dim=128,
            rope_parameters=REAL_ROPE,
        ),
        tie=True,
    ),
}


def save_tt_checkpoint(path: Path, name: str, seed: int) -> torch.nn.Module:
    """Save TT_TINY[name] (random weights, tokenizer) to `path`; returns the transformers model.

    An untied lm_head is overwritten on disk with a copy of the token embeddings (still a separate tensor, so
    the untied load path is what runs). Random heads give near-tied logits: for 'gqa2' 30% of greedy steps have
    a top-1/top-2 gap under 0.1 logit std, so even the torch bfloat16 model agrees with float32 on only 95.3%
    of 128 teacher-forced tokens; an embedding-shaped head peaks like a trained one and keeps the top-1 test
    about the device rather than about ties.
    """
    spec = TT_TINY[name]
    hf = save_checkpoint(path, spec["text"], tie=spec["tie"], seed=seed)
    if not spec["tie"]:
        file = path / "model.safetensors"
        tensors = load_file(file)
        head = next(k for k in tensors if k.endswith("lm_head.weight"))
        embed = next(k for k in tensors if k.endswith("embed_tokens.weight"))
        tensors[head] = tensors[embed].clone()
        save_file(tensors, file, metadata={"format": "pt"})
    return hf


class RecipeRoundedCheckpoint(Checkpoint):
    """A checkpoint whose linear weights read back with the device's rounding for a precision recipe.

    Each weight goes through ttnn's host packer in its group's dtype, in the device layout (`[K, N]`, so the
    16-value block-float blocks are the device's), and back. A torch `TextModel` built from it is the
    reference that isolates the device implementation's error from the recipe's quantisation error. A tied
    head stays unrounded: it is also the input embedding, which the device looks up in bf16.
    """

    def __init__(self, directory: Path, precision: Precision, ttnn: Any):
        cfg = load_config(directory)
        super().__init__(directory, cfg.weight_prefix)
        self.ttnn = ttnn
        self.group = {
            source: precision.dtype(spec.group)
            for spec in text_weight_specs(cfg, dram_banks=8)
            if spec.group != "norm" and spec.sources != (EMBED,)
            for source in spec.sources
        }

    def get(
        self, name: str, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
    ) -> torch.Tensor:
        t = super().get(name)
        if name in self.group:
            host = to_host_tensor(self.ttnn, t.t().contiguous(), self.group[name], "tile")
            t = self.ttnn.to_torch(host).reshape(t.shape[1], t.shape[0]).t().to(t.dtype)
        return t.to(device, dtype or t.dtype)

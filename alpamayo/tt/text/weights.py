"""The text backbone's device weights: uploaded by name (`WeightSpec` names), then held per block.

`upload_text_weights` returns the decoder's weights as `TextWeights`: one `LayerWeights` per layer (its
attention, norms and either a dense SwiGLU or a sparse MoE block) and the final norm and lm_head. The action
expert's and the DFlash draft's layers are the same blocks under another name prefix (`LayerWeights.take`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alpamayo.checkpoint import Checkpoint
from alpamayo.config.model import ModelConfig
from alpamayo.plan.precision import Precision
from alpamayo.plan.programs.text import TextPlan
from alpamayo.plan.weights import text_weight_specs
from alpamayo.text.moe.weights import ExpertView
from alpamayo.tt.device_io import DeviceTensor
from alpamayo.tt.moe import MoEWeights
from alpamayo.tt.weight_cache import NamedTensors, upload_weights


@dataclass
class DenseMLPWeights:
    """A dense SwiGLU's projections, DRAM width-sharded: gate and up [H_p, I_p], down [I_p, H_p]."""

    gate: DeviceTensor
    up: DeviceTensor
    down: DeviceTensor

    def tensors(self) -> list[DeviceTensor]:
        return [self.gate, self.up, self.down]


@dataclass
class LayerWeights:
    """One pre-norm decoder layer (`decoder_layer_specs`): fused q/k/v [H_p, q + 2 kv] and o [q, H_p]
    projections, the residual norms' gammas row-major (decode's sharded norm) and as TILE (prefill's
    interleaved norm), the per-head q/k norms' gammas (row-major), and its MLP: dense (`mlp`) or sparse
    (`moe`), exactly one of them."""

    wqkv: DeviceTensor
    wo: DeviceTensor
    attn_norm_rm: DeviceTensor
    attn_norm_tile: DeviceTensor
    mlp_norm_rm: DeviceTensor
    mlp_norm_tile: DeviceTensor
    q_norm: DeviceTensor
    k_norm: DeviceTensor
    mlp: DenseMLPWeights | None
    moe: MoEWeights | None

    @classmethod
    def take(cls, named: NamedTensors, prefix: str) -> LayerWeights:
        """The layer whose tensors are named `prefix` + wqkv, wo, ... (`layers.{i}.`, `expert.layers.{i}.`,
        `draft.layers.{i}.`); a layer with a `router` is sparse."""

        def w(name: str) -> DeviceTensor:
            return named[prefix + name]

        sparse = prefix + "router" in named
        return cls(
            wqkv=w("wqkv"),
            wo=w("wo"),
            attn_norm_rm=w("attn_norm.rm"),
            attn_norm_tile=w("attn_norm.tile"),
            mlp_norm_rm=w("mlp_norm.rm"),
            mlp_norm_tile=w("mlp_norm.tile"),
            q_norm=w("q_norm.rm"),
            k_norm=w("k_norm.rm"),
            mlp=None if sparse else DenseMLPWeights(w("w_gate"), w("w_up"), w("w_down")),
            moe=(
                MoEWeights(w("router"), w("experts.gate"), w("experts.up"), w("experts.down"))
                if sparse
                else None
            ),
        )

    @property
    def dense(self) -> DenseMLPWeights:
        """The dense SwiGLU (refused on a sparse layer)."""
        if self.mlp is None:
            raise ValueError("a sparse layer has no dense MLP weights")
        return self.mlp

    def tensors(self) -> list[DeviceTensor]:
        attn = [self.wqkv, self.wo, self.attn_norm_rm, self.attn_norm_tile]
        norms = [self.mlp_norm_rm, self.mlp_norm_tile, self.q_norm, self.k_norm]
        mlp = self.mlp.tensors() if self.mlp is not None else []
        moe = self.moe.tensors() if self.moe is not None else []
        return attn + norms + mlp + moe


@dataclass
class TextWeights:
    """Every device weight of the text decoder: its layers, the final norm's gamma row-major (decode) and
    TILE (prefill), and the lm_head [H_p, V_p] (`text_weight_specs`)."""

    layers: list[LayerWeights]
    norm_rm: DeviceTensor
    norm_tile: DeviceTensor
    lm_head: DeviceTensor

    @classmethod
    def take(cls, named: NamedTensors, layers: int) -> TextWeights:
        """The decoder of `layers` layers from its tensors by `text_weight_specs` name."""
        return cls(
            [LayerWeights.take(named, f"layers.{i}.") for i in range(layers)],
            named["norm.rm"],
            named["norm.tile"],
            named["lm_head"],
        )

    def tensors(self) -> list[DeviceTensor]:
        return [t for layer in self.layers for t in layer.tensors()] + [
            self.norm_rm,
            self.norm_tile,
            self.lm_head,
        ]


def upload_text_weights(
    cfg: ModelConfig,
    precision: Precision,
    plan: TextPlan,
    device: Any,
    ckpt: Checkpoint,
    cache_dir: str | Path | None,
) -> TextWeights:
    """Every text `WeightSpec` (experts through their per-projection views) on its device placement."""
    banks = plan.device.dram_banks
    specs = text_weight_specs(cfg, banks)
    named = upload_weights(specs, precision, device, ExpertView(cfg.text, ckpt.get), cache_dir, banks)
    return TextWeights.take(named, cfg.text.num_hidden_layers)

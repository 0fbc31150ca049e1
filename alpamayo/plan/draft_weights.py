"""The DFlash draft's device tensors as `WeightSpec`s and its device cache layout (no ttnn): what
`alpamayo.tt.draft` uploads and allocates, and what `alpamayo.plan.estimate` costs.

  * `draft.layers.{i}.…`: the draft's decoder layers, the text backbone's layer specs
    (`alpamayo.plan.weights.decoder_layer_specs`, the target's precision groups) read from `layers.{i}.`,
    padded to whole tiles only and interleaved in DRAM, as the action expert's: the draft runs prefill-style
    matmuls on its 32-row block tiles;
  * `draft.fc`: `fc` [n x H, H] (n = len(target_layer_ids)) in the `qkv` group: it feeds every layer's k/v
    projections;
  * `draft.hidden_norm.tile`, `draft.norm.tile`: TILE gammas on the draft's residual stream (hidden rounded to
    a tile, scaled as `norm_specs` does).
"""

from __future__ import annotations

from dataclasses import replace

from alpamayo.drafts.dflash import DFlashConfig
from alpamayo.plan.device_spec import TILE, round_up
from alpamayo.plan.weights import (
    TEXT_GROUPS,
    WeightSpec,
    decoder_layer_specs,
    linear_specs,
    norm_specs,
    padded_hidden,
)

DRAFT_BANKS = 1  # the draft's padding granule: whole tiles (interleaved weights, as the action expert's)
FC_GROUP = "qkv"
CACHE_ROW_GRANULE = 128  # whole k chunks of the block's SDPA (`TextPlan.prefill_sdpa_chunk`: 128 or 256)


def draft_weight_specs(cfg: DFlashConfig) -> list[WeightSpec]:
    """Every device tensor of the draft, in load order (all interleaved in DRAM)."""
    t = cfg.text
    hp = padded_hidden(t, DRAFT_BANKS)
    specs: list[WeightSpec] = []
    for i in range(t.num_hidden_layers):
        layer = decoder_layer_specs(t, f"layers.{i}.", f"draft.layers.{i}.", DRAFT_BANKS, TEXT_GROUPS, i)
        specs += [replace(s, placement="dram") for s in layer]
    specs += linear_specs(
        "draft.fc", "fc.", FC_GROUP, len(cfg.target_layer_ids) * t.hidden_size, t.hidden_size, bias=False
    )
    specs += norm_specs("draft.hidden_norm", "hidden_norm.weight", t.hidden_size, ("tile",), hp)
    specs += norm_specs("draft.norm", "norm.weight", t.hidden_size, ("tile",), hp)
    return specs


def block_region(max_seq_len: int) -> int:
    """First cache row of every slot's block region: a context fill ends by max_seq_len, rounded to a tile."""
    return round_up(max_seq_len, TILE)


def draft_cache_rows(max_seq_len: int) -> int:
    """Rows per slot of the draft's device K/V cache: the context, then one tile of block region."""
    return round_up(block_region(max_seq_len) + TILE, CACHE_ROW_GRANULE)

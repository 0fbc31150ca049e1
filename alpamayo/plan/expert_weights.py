"""The action expert's device tensors as `WeightSpec`s (layouts as in `alpamayo.plan.weights`; no ttnn).

Every linear weight is in the recipe's `expert` group; norms and biases stay bf16. Names:

  * `expert.layers.{i}.…`: the decoder layers, the text backbone's layer specs
    (`alpamayo.plan.weights.decoder_layer_specs`) read from `{prefixes.expert}layers.{i}.`, padded to whole tiles
    only (one "bank") and interleaved in DRAM: the expert runs prefill-style matmuls alone, which need no
    DRAM-sharded weights (the seed measured minimal_matmul equal on both), so its fused QKV width need not be
    a multiple of 32 x 8 banks as the VLM's decode head split requires (the demo's tiny expert: 192);
  * `expert.norm.tile`: the final RMSNorm on the residual stream (`hidden_p` wide, scaled gamma);
  * `expert.in_proj.{j}` (+ `.bias`), `expert.in_proj.norm{j}.tile`, `expert.in_proj.ln.{weight,bias}`: the
    in-projection MLP `PerWaypointActionInProjV2.encoder.trunk` and its closing LayerNorm. The first linear
    takes the whole 60-wide feature row `[FE(a), FE(kappa), FE(t)]` (K padded to 64 with zero rows): the
    device writes the t features into their columns each step (`alpamayo.tt.expert`);
  * `expert.out_proj` (+ `.bias`): `action_out_proj` `[hidden_p, 32]`, its 2 output columns padded to a tile
    with zeros, so the padded velocity columns are exactly 0.
"""

from __future__ import annotations

from dataclasses import replace

from alpamayo.config.expert import ACTION_DIMS, ExpertConfig
from alpamayo.plan.weights import (
    LayerGroups,
    WeightSpec,
    decoder_layer_specs,
    layer_norm_specs,
    linear_specs,
    norm_specs,
    padded_hidden,
)

EXPERT_GROUPS = LayerGroups(qkv="expert", o="expert", gate_up="expert", down="expert")
EXPERT_BANKS = 1  # the expert's padding granule: whole tiles (its weights are interleaved, not bank-sharded)


def in_proj_specs(expert: ExpertConfig) -> list[WeightSpec]:
    """The in-projection MLP: Linear, SiLU, then (RMSNorm, Linear, SiLU) per extra layer, RMSNorm, Linear,
    LayerNorm (see `alpamayo.config.expert.ExpertConfig._in_proj_shapes`)."""
    c, hidden = expert.in_proj, expert.text.hidden_size
    trunk = f"{expert.prefixes.in_proj}encoder.trunk."
    specs = linear_specs("expert.in_proj.0", trunk + "0.", "expert", c.num_features, c.hidden_size)
    for layer in range(c.num_enc_layers):
        norm = 2 + 3 * layer
        out = hidden if layer == c.num_enc_layers - 1 else c.hidden_size
        specs += norm_specs(f"expert.in_proj.norm{norm}", f"{trunk}{norm}.weight", c.hidden_size, ("tile",))
        specs += linear_specs(
            f"expert.in_proj.{norm + 1}", f"{trunk}{norm + 1}.", "expert", c.hidden_size, out
        )
    specs += layer_norm_specs("expert.in_proj.ln", f"{expert.prefixes.in_proj}norm.", hidden)
    return specs


def expert_weight_specs(expert: ExpertConfig) -> list[WeightSpec]:
    """Every device tensor of the action expert, in load order (all interleaved in DRAM)."""
    t, p = expert.text, expert.prefixes
    hp = padded_hidden(t, EXPERT_BANKS)
    specs: list[WeightSpec] = []
    for i in range(t.num_hidden_layers):
        layer = decoder_layer_specs(
            t, f"{p.expert}layers.{i}.", f"expert.layers.{i}.", EXPERT_BANKS, EXPERT_GROUPS, i
        )
        specs += [replace(s, placement="dram") for s in layer]
    specs += norm_specs("expert.norm", f"{p.expert}norm.weight", t.hidden_size, ("tile",), hp)
    specs += in_proj_specs(expert)
    specs += linear_specs(
        "expert.out_proj",
        p.out_proj,
        "expert",
        t.hidden_size,
        ACTION_DIMS,
        bias=expert.out_proj_bias,
        k_padded=hp,
    )
    return specs

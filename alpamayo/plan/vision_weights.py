"""Device tensors of the vision tower (`WeightSpec`s; layouts in `alpamayo.plan.weights`).

Names are `vision.patch_embed`, `vision.blocks.{j}.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}`,
`vision.merger.{norm,fc1,fc2}` and `vision.deepstack.{k}.{norm,fc1,fc2}`, each weight followed by its
`.bias` (LayerNorms: `.weight` and `.bias`). Linear weights are `[K, N]` in the recipe's `vision` dtype;
biases and LayerNorm parameters are bf16 `[1, 1, 1, N]` rows. The attention heads are padded to
`rotary_head_dim(head_dim)` lanes in the split-half layout (q, k, v columns and their biases, and the rows of
the output projection); the MLP width is zero-padded to whole tiles (zero fc1 columns and bias entries,
zero fc2 rows: gelu(0) = 0). The learned position table stays on the host.
"""

from __future__ import annotations

from alpamayo.config.model import VisionConfig
from alpamayo.plan.weights import WeightSpec, layer_norm_specs, linear_specs, rotary_head_dim
from vision.weights import MERGER, PATCH_EMBED, block_prefix, deepstack_prefix


def _attention(name: str, source: str, cfg: VisionConfig) -> list[WeightSpec]:
    c, heads = cfg.hidden_size, cfg.num_heads
    lanes = heads * rotary_head_dim(cfg.head_dim)
    splits = (c, c, c)
    return [
        WeightSpec(
            name + "qkv", (source + "qkv.weight",), "vision", "qkv_heads", (c, 3 * lanes), (c, 3 * lanes),
            heads=heads, splits=splits,
        ),
        WeightSpec(
            name + "qkv.bias", (source + "qkv.bias",), "bias", "qkv_heads_bias", (1, 1, 1, 3 * lanes),
            (1, 1, 1, 3 * lanes), heads=heads, splits=splits,
        ),
        WeightSpec(
            name + "proj", (source + "proj.weight",), "vision", "proj_heads", (lanes, c), (lanes, c),
            heads=heads, splits=(c,),
        ),
        WeightSpec(name + "proj.bias", (source + "proj.bias",), "bias", "gamma_tile", (1, 1, 1, c), (1, 1, 1, c)),
    ]  # fmt: skip


def _merger(name: str, source: str, cfg: VisionConfig, norm_dim: int) -> list[WeightSpec]:
    fused = cfg.hidden_size * cfg.spatial_merge_size**2
    return [
        *layer_norm_specs(name + ".norm", source + "norm.", norm_dim),
        *linear_specs(name + ".fc1", source + "linear_fc1.", "vision", fused, fused),
        *linear_specs(name + ".fc2", source + "linear_fc2.", "vision", fused, cfg.out_hidden_size),
    ]


def vision_weight_specs(cfg: VisionConfig) -> list[WeightSpec]:
    """Every device tensor of the vision tower, in load order (see module docstring)."""
    c, inter = cfg.hidden_size, cfg.intermediate_size
    specs = linear_specs("vision.patch_embed", PATCH_EMBED, "vision", cfg.patch_dim, c, "patch_embed")
    for j in range(cfg.depth):
        src, name = block_prefix(j), f"vision.blocks.{j}."
        specs += layer_norm_specs(name + "norm1", src + "norm1.", c)
        specs += _attention(name + "attn.", src + "attn.", cfg)
        specs += layer_norm_specs(name + "norm2", src + "norm2.", c)
        specs += linear_specs(name + "mlp.fc1", src + "mlp.linear_fc1.", "vision", c, inter)
        specs += linear_specs(name + "mlp.fc2", src + "mlp.linear_fc2.", "vision", inter, c)
    specs += _merger("vision.merger", MERGER, cfg, c)
    for k in range(len(cfg.deepstack_visual_indexes)):
        specs += _merger(f"vision.deepstack.{k}", deepstack_prefix(k), cfg, c * cfg.spatial_merge_size**2)
    return specs

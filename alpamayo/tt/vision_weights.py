"""Device tensors of the vision tower (`WeightSpec`s; layouts in `alpamayo.tt.weights`).

Names are `vision.patch_embed`, `vision.blocks.{j}.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}`,
`vision.merger.{norm,fc1,fc2}` and `vision.deepstack.{k}.{norm,fc1,fc2}`, each weight followed by its
`.bias` (LayerNorms: `.weight` and `.bias`). Linear weights are `[K, N]` in the recipe's `vision` dtype;
biases and LayerNorm parameters are bf16 `[1, 1, 1, N]` rows. The attention heads are padded to
`rotary_head_dim(head_dim)` lanes in the split-half layout (q, k, v columns and their biases, and the rows of
the output projection); the MLP width is zero-padded to whole tiles (zero fc1 columns and bias entries,
zero fc2 rows: gelu(0) = 0). The learned position table stays on the host.
"""

from __future__ import annotations

from alpamayo.config import VisionConfig
from alpamayo.tt.device_spec import TILE, round_up
from alpamayo.tt.weights import WeightSpec, rotary_head_dim
from vision.weights import MERGER, PATCH_EMBED, block_prefix, deepstack_prefix


def _tiles(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (*shape[:-2], round_up(shape[-2], TILE), round_up(shape[-1], TILE))


def _linear(name: str, source: str, k: int, n: int, transform: str = "linear", **kw) -> list[WeightSpec]:
    """A vision linear `[K, N]` and its bias row."""
    n_padded = round_up(n, TILE)
    return [
        WeightSpec(name, (source + "weight",), "vision", transform, (k, n), _tiles((k, n)), **kw),
        WeightSpec(
            name + ".bias", (source + "bias",), "bias", "gamma_tile", (1, 1, 1, n), (1, 1, 1, n_padded)
        ),
    ]


def _layer_norm(name: str, source: str, dim: int) -> list[WeightSpec]:
    shape = (1, 1, 1, dim)
    return [
        WeightSpec(name + ".weight", (source + "weight",), "norm", "gamma_tile", shape, shape),
        WeightSpec(name + ".bias", (source + "bias",), "bias", "gamma_tile", shape, shape),
    ]


def _attention(name: str, source: str, cfg: VisionConfig) -> list[WeightSpec]:
    c, heads = cfg.hidden_size, cfg.num_heads
    lanes = heads * rotary_head_dim(cfg.head_dim)
    qkv = dict(heads=heads, splits=(c, c, c))
    return [
        WeightSpec(name + "qkv", (source + "qkv.weight",), "vision", "qkv_heads", (c, 3 * lanes), (c, 3 * lanes), **qkv),
        WeightSpec(
            name + "qkv.bias", (source + "qkv.bias",), "bias", "qkv_heads_bias", (1, 1, 1, 3 * lanes),
            (1, 1, 1, 3 * lanes), **qkv,
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
        *_layer_norm(name + ".norm", source + "norm.", norm_dim),
        *_linear(name + ".fc1", source + "linear_fc1.", fused, fused),
        *_linear(name + ".fc2", source + "linear_fc2.", fused, cfg.out_hidden_size),
    ]


def vision_weight_specs(cfg: VisionConfig) -> list[WeightSpec]:
    """Every device tensor of the vision tower, in load order (see module docstring)."""
    c, inter = cfg.hidden_size, cfg.intermediate_size
    specs = _linear("vision.patch_embed", PATCH_EMBED, cfg.patch_dim, c, "patch_embed")
    for j in range(cfg.depth):
        src, name = block_prefix(j), f"vision.blocks.{j}."
        specs += _layer_norm(name + "norm1", src + "norm1.", c)
        specs += _attention(name + "attn.", src + "attn.", cfg)
        specs += _layer_norm(name + "norm2", src + "norm2.", c)
        specs += _linear(name + "mlp.fc1", src + "mlp.linear_fc1.", c, inter)
        specs += _linear(name + "mlp.fc2", src + "mlp.linear_fc2.", inter, c)
    specs += _merger("vision.merger", MERGER, cfg, c)
    for k in range(len(cfg.deepstack_visual_indexes)):
        specs += _merger(f"vision.deepstack.{k}", deepstack_prefix(k), cfg, c * cfg.spatial_merge_size**2)
    return specs

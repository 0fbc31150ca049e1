"""Model configuration parsed from a checkpoint directory's `config.json`.

Accepted layouts, one per model family (`alpamayo.families`, detected from `architectures` / `model_type`):
  * Hugging Face `Qwen3VLForConditionalGeneration` / `Qwen3VLMoeForConditionalGeneration` (hub files and
    transformers-5 `save_pretrained` files: both rope spellings, `num_experts` or `num_local_experts`);
  * the project's demo layout and Alpamayo 2 Super: the Qwen3-VL config nested under `vlm_config`;
  * Alpamayo 1 (R1) and 1.5: a flat config whose `vlm_name_or_path` names the base model; its Qwen3-VL config
    is used with the vocabulary of the extended tokenizer (`alpamayo.config.loader`).
In every Alpamayo family each VLM weight is prefixed `vlm.`, and the remaining top-level keys (trajectory
tokenizer settings, action expert, ...) are kept verbatim in `ModelConfig.extra`, as data: Hydra `_target_` /
`_recursive_` keys are never imported.

Dimensions come only from here; nothing else in the package hard-codes a model size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alpamayo.config.moe import MoEConfig, parse_moe
from alpamayo.errors import ConfigError
from alpamayo.families.registry import FAMILIES, QWEN3_VL, RELEASE_IDS, Family, detect_family
from alpamayo.json_fields import Fields, read_json

ARCHITECTURES = {
    "Qwen3VLForConditionalGeneration": "dense",
    "Qwen3VLMoeForConditionalGeneration": "moe",
}
MODEL_TYPES = {"qwen3_vl": "dense", "qwen3_vl_moe": "moe"}
# Rope types whose frequencies are the plain 1/theta^(2i/d) table. "mrope" is the Qwen2-VL era spelling.
PLAIN_ROPE_TYPES = ("default", "mrope")
DEFAULT_MROPE_SECTION = (24, 20, 20)  # transformers' fallback when the config omits it
ALPAMAYO_VLM_KEY = "vlm_config"


@dataclass(frozen=True)
class TextConfig:
    """Qwen3-VL text decoder dimensions. `head_dim` may differ from hidden/heads (Qwen3-VL-4B: 2560 vs 32*128)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, int, int] = DEFAULT_MROPE_SECTION
    max_position_embeddings: int = 262144
    attention_bias: bool = False
    moe: MoEConfig | None = None

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def gqa_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def is_sparse(self, layer: int) -> bool:
        """Decoder layer `layer` has an MoE block (never in a dense model; `MoEConfig.is_sparse`)."""
        return self.moe is not None and self.moe.is_sparse(layer)

    @property
    def sparse_layers(self) -> list[int]:
        """The decoder layers with an MoE block, in order (empty for a dense model)."""
        return [i for i in range(self.num_hidden_layers) if self.is_sparse(i)]

    def layer_shapes(self, i: int, prefix: str) -> dict[str, list[tuple[int, ...]]]:
        """Every tensor of decoder layer i under `prefix` (e.g. 'language_model.layers.3.') -> its allowed
        on-disk shapes, `[out_features, in_features]` for linear weights: attention, norms, and the dense
        SwiGLU or, where `is_sparse(i)`, the router and the fused experts in either layout (`expert_layouts`)."""
        h, d, p = self.hidden_size, self.head_dim, prefix
        shapes: dict[str, list[tuple[int, ...]]] = {}
        for name, out in (("q_proj", self.q_dim), ("k_proj", self.kv_dim), ("v_proj", self.kv_dim)):
            shapes[f"{p}self_attn.{name}.weight"] = [(out, h)]
            if self.attention_bias:
                shapes[f"{p}self_attn.{name}.bias"] = [(out,)]
        shapes[p + "self_attn.o_proj.weight"] = [(h, self.q_dim)]
        if self.attention_bias:
            shapes[p + "self_attn.o_proj.bias"] = [(h,)]
        shapes[p + "self_attn.q_norm.weight"] = [(d,)]
        shapes[p + "self_attn.k_norm.weight"] = [(d,)]
        shapes[p + "input_layernorm.weight"] = [(h,)]
        shapes[p + "post_attention_layernorm.weight"] = [(h,)]
        if self.moe is not None and self.moe.is_sparse(i):
            shapes[p + "mlp.gate.weight"] = [(self.moe.num_experts, h)]
            layouts = expert_layouts(self.moe.num_experts, h, self.moe.moe_intermediate_size).values()
            shapes[p + "mlp.experts.gate_up_proj"] = [gu for gu, _ in layouts]
            shapes[p + "mlp.experts.down_proj"] = [dn for _, dn in layouts]
        else:
            shapes[p + "mlp.gate_proj.weight"] = [(self.intermediate_size, h)]
            shapes[p + "mlp.up_proj.weight"] = [(self.intermediate_size, h)]
            shapes[p + "mlp.down_proj.weight"] = [(h, self.intermediate_size)]
        return shapes


def expert_layouts(
    num_experts: int, hidden: int, inter: int
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """(gate_up_proj, down_proj) shapes of fused MoE expert tensors in each on-disk layout:

    "hub": gate_up_proj [E, H, 2I], down_proj [E, I, H]  (released hub safetensors; transformers 4.57)
    "v5":  gate_up_proj [E, 2I, H], down_proj [E, H, I]  (transformers 5 save_pretrained)
    """
    return {
        "hub": ((num_experts, hidden, 2 * inter), (num_experts, inter, hidden)),
        "v5": ((num_experts, 2 * inter, hidden), (num_experts, hidden, inter)),
    }


@dataclass(frozen=True)
class VisionConfig:
    """Qwen3-VL vision tower dimensions (patches are `in_channels x temporal_patch_size x patch_size^2`)."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    deepstack_visual_indexes: tuple[int, ...]
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    num_position_embeddings: int = 2304
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


@dataclass(frozen=True)
class ModelConfig:
    """Everything the runtime needs to know about one checkpoint."""

    kind: str  # "dense" or "moe"
    text: TextConfig
    vision: VisionConfig | None
    tie_word_embeddings: bool
    image_token_id: int | None = None
    video_token_id: int | None = None
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # Alpamayo top-level keys besides `vlm_config`
    source: str = ""
    family_name: str = QWEN3_VL.name  # `alpamayo.families.FAMILIES` key
    base_model: str | None = None  # R1 / 1.5: the resolved base-model directory (tokenizer, processor)
    # The text_config object as written (HF spelling): the action expert's config copies it (alpamayo.expert).
    raw_text_config: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def family(self) -> Family:
        return FAMILIES[self.family_name]

    @property
    def weight_prefix(self) -> str:
        """Prefix of every VLM tensor name on disk: the family's ("vlm." for Alpamayo checkpoints)."""
        return self.family.weight_prefix

    @property
    def is_alpamayo(self) -> bool:
        return self.weight_prefix != ""


def _model_kind(cfg: Fields) -> str:
    """`dense` or `moe` from `architectures` (preferred) or `model_type`."""
    if cfg.has("architectures"):
        archs = cfg.data["architectures"]
        if not isinstance(archs, list) or not archs:
            raise ConfigError(f"{cfg.source}: field '{cfg.name('architectures')}' must be a non-empty list")
        known = [ARCHITECTURES[a] for a in archs if a in ARCHITECTURES]
        if not known:
            releases = [arch for arch, _ in RELEASE_IDS.values()]
            raise ConfigError(
                f"{cfg.source}: unsupported architecture {archs!r} in field '{cfg.name('architectures')}'; "
                f"supported: {sorted(ARCHITECTURES)}, the Alpamayo releases {releases}, or the project's "
                "layout (a Qwen3-VL config nested under 'vlm_config')"
            )
        return known[0]
    model_type = cfg.str("model_type")
    if model_type not in MODEL_TYPES:
        raise ConfigError(
            f"{cfg.source}: unsupported model_type {model_type!r} in field '{cfg.name('model_type')}' "
            f"(and no 'architectures'); supported: {sorted(MODEL_TYPES)}"
        )
    return MODEL_TYPES[model_type]


def _rope(text: Fields, head_dim: int) -> tuple[float, tuple[int, int, int]]:
    """(theta, mrope_section) from `rope_parameters` (transformers 5 save) or `rope_scaling` + `rope_theta` (hub).

    `mrope_interleaved` is not read: transformers always uses the interleaved T/H/W layout.
    """
    if text.has("rope_parameters"):
        rope = text.sub("rope_parameters")
        theta_from = rope if rope.has("rope_theta") else text
    else:
        rope, theta_from = text.optional_sub("rope_scaling"), text
    theta = theta_from.number("rope_theta", positive=True)
    rope_type = rope.data.get("rope_type", rope.data.get("type", "default"))
    if rope_type not in PLAIN_ROPE_TYPES:
        raise ConfigError(
            f"{text.source}: unsupported rope type {rope_type!r} in '{rope.path}'; supported: {list(PLAIN_ROPE_TYPES)}"
        )
    section = rope.int_list("mrope_section", DEFAULT_MROPE_SECTION, minimum=0)
    if len(section) != 3 or sum(section) != head_dim // 2:
        raise ConfigError(
            f"{text.source}: field '{rope.name('mrope_section')}' = {list(section)} must have 3 entries "
            f"summing to head_dim/2 = {head_dim // 2}"
        )
    return theta, (section[0], section[1], section[2])


def parse_text_config(text: Fields, kind: str = "dense") -> TextConfig:
    """A `TextConfig` from one HF-style Qwen3-VL text-config object (`kind`: "dense" or "moe"): the VLM's
    `text_config`, and the action expert's transformer config (`alpamayo.config.expert`)."""
    hidden = text.int("hidden_size")
    heads = text.int("num_attention_heads")
    kv_heads = text.int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise ConfigError(
            f"{text.source}: '{text.name('num_attention_heads')}' = {heads} is not a multiple of "
            f"'{text.name('num_key_value_heads')}' = {kv_heads}"
        )
    head_dim = text.int("head_dim", hidden // heads)
    if head_dim % 2:
        raise ConfigError(
            f"{text.source}: '{text.name('head_dim')}' = {head_dim} must be even for rotary embeddings"
        )
    act = text.str("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(
            f"{text.source}: unsupported '{text.name('hidden_act')}' = {act!r}; supported: 'silu'"
        )
    theta, section = _rope(text, head_dim)
    n_layers = text.int("num_hidden_layers")
    return TextConfig(
        vocab_size=text.int("vocab_size"),
        hidden_size=hidden,
        intermediate_size=text.int("intermediate_size"),
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=text.number("rms_norm_eps", positive=True),
        rope_theta=theta,
        mrope_section=section,
        max_position_embeddings=text.int("max_position_embeddings", 262144),
        attention_bias=text.bool("attention_bias", False),
        moe=parse_moe(text, n_layers) if kind == "moe" else None,
    )


def _vision_config(vis: Fields) -> VisionConfig:
    hidden = vis.int("hidden_size")
    heads = vis.int("num_heads")
    if hidden % heads:
        raise ConfigError(
            f"{vis.source}: '{vis.name('hidden_size')}' = {hidden} is not a multiple of num_heads {heads}"
        )
    depth = vis.int("depth")
    deepstack = vis.int_list("deepstack_visual_indexes")
    bad = [i for i in deepstack if i >= depth]
    if bad:
        raise ConfigError(
            f"{vis.source}: '{vis.name('deepstack_visual_indexes')}' has blocks {bad} >= depth {depth}"
        )
    n_pos = vis.int("num_position_embeddings")
    if round(n_pos**0.5) ** 2 != n_pos:
        raise ConfigError(
            f"{vis.source}: '{vis.name('num_position_embeddings')}' = {n_pos} is not a square grid"
        )
    rope_theta = vis.optional_sub("rope_parameters").number("rope_theta", 10000.0, positive=True)
    return VisionConfig(
        depth=depth,
        hidden_size=hidden,
        intermediate_size=vis.int("intermediate_size"),
        num_heads=heads,
        out_hidden_size=vis.int("out_hidden_size"),
        deepstack_visual_indexes=deepstack,
        in_channels=vis.int("in_channels"),
        patch_size=vis.int("patch_size"),
        temporal_patch_size=vis.int("temporal_patch_size"),
        spatial_merge_size=vis.int("spatial_merge_size"),
        num_position_embeddings=n_pos,
        hidden_act=vis.str("hidden_act"),
        rope_theta=rope_theta,
    )


def parse_config(
    raw: dict[str, Any],
    source: str = "config.json",
    eos_token_ids: tuple[int, ...] = (),
    base_vlm: dict[str, Any] | None = None,
    base_model: str | None = None,
) -> ModelConfig:
    """Parse a `config.json` object (any family's layout) into a `ModelConfig`.

    R1 / 1.5 configs carry no Qwen3-VL config: `base_vlm` is their base model's, with the vocabulary already
    set to the extended tokenizer's length (`alpamayo.config.loader.load_model_config` builds it)."""
    root = Fields(raw, "", source)
    family = detect_family(raw)
    extra = {k: v for k, v in raw.items() if k != ALPAMAYO_VLM_KEY} if family.weight_prefix else {}
    if family.uses_base_model:
        if base_vlm is None:
            raise ConfigError(
                f"{source}: an {family.title} config.json carries no Qwen3-VL config; it comes from the base "
                "model 'vlm_name_or_path' (load the checkpoint directory with load_model_config)"
            )
        vlm = Fields(base_vlm, "", f"{source} (base model {base_model})")
    else:
        vlm = root.sub(ALPAMAYO_VLM_KEY) if family.vlm_source == ALPAMAYO_VLM_KEY else root
    kind = _model_kind(vlm)
    text_fields = vlm.sub("text_config")
    text = parse_text_config(text_fields, kind)
    vision = _vision_config(vlm.sub("vision_config")) if vlm.has("vision_config") else None
    if vision is not None and vision.out_hidden_size != text.hidden_size:
        raise ConfigError(
            f"{source}: vision_config.out_hidden_size = {vision.out_hidden_size} must equal "
            f"text_config.hidden_size = {text.hidden_size}"
        )
    tie_from = vlm if vlm.has("tie_word_embeddings") else text_fields
    return ModelConfig(
        kind=kind,
        text=text,
        vision=vision,
        tie_word_embeddings=tie_from.bool("tie_word_embeddings", False),
        image_token_id=vlm.optional_id("image_token_id"),
        video_token_id=vlm.optional_id("video_token_id"),
        vision_start_token_id=vlm.optional_id("vision_start_token_id"),
        vision_end_token_id=vlm.optional_id("vision_end_token_id"),
        # without generation_config.json: transformers' `GenerationConfig.from_model_config`, the VLM config's
        # own `eos_token_id`, else its text config's
        eos_token_ids=tuple(eos_token_ids)
        or _eos_ids(vlm.data.get("eos_token_id"))
        or _eos_ids(text_fields.data.get("eos_token_id")),
        extra=extra,
        source=source,
        family_name=family.name,
        base_model=base_model,
        raw_text_config=text_fields.data,
    )


def _eos_ids(value: Any) -> tuple[int, ...]:
    """`eos_token_id` as config files spell it, one id or a list of ids; anything else means none."""
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list) and all(isinstance(e, int) for e in value):
        return tuple(value)
    return ()


def generation_eos(directory: Path) -> tuple[int, ...]:
    path = directory / "generation_config.json"
    if not path.is_file():
        return ()
    return _eos_ids(Fields(read_json(path), "", str(path)).data.get("eos_token_id"))

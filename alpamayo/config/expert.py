"""The flow-matching action expert's configuration, derived from a checkpoint's raw `config.json`.

Two layouts (NVIDIA's public code is the definition):
  * Alpamayo R1 / 1.5 (flat `config.json`): the expert transformer is a copy of the VLM's text config with
    each `expert_cfg` key set on it (`expert_cfg` absent: a plain copy); the projections and sampler come from
    the top-level `action_in_proj_cfg`, `action_out_proj_cfg`, `diffusion_cfg` and
    `expert_non_causal_attention`. Weights: `expert.*`, `action_in_proj.*`, `action_out_proj.*`.
  * Alpamayo 2 Super: `expert_config` holds a full `llm_config` (a text-model config, not overrides) beside
    the same four settings. Weights: `expert.expert.*`, `expert.action_in_proj.*`, `expert.action_out_proj.*`.
    Super's model class refuses a config that turns classifier-free guidance on (`ExpertModel`); its navigation
    guidance runs as `examples/two_gpu_nav_cfg_demo.py` composes it, at the config's weight and noise
    temperature 1.

The expert reads the VLM's KV cache layer by layer, so `validate_against_vlm` requires equal layer counts and
equal K/V layouts (KV heads x head_dim) before any weight is read.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from alpamayo.config.model import ModelConfig, TextConfig, parse_text_config
from alpamayo.errors import ConfigError
from alpamayo.json_fields import Fields

FLAT = "flat"  # Alpamayo R1 / 1.5
SUPER = "super"  # Alpamayo 2 Super
FLAT_EXPERT_KEYS = ("expert_cfg", "action_in_proj_cfg")  # either one means the flat config has an expert
SUPER_EXPERT_KEY = "expert_config"
ACTION_DIMS = 2  # (acceleration, curvature) per waypoint: the unicycle action space of every release
IN_PROJ_TARGET = "PerWaypointActionInProjV2"
DIFFUSION_TARGET = "FlowMatching"
OUT_PROJ_TARGET = "Linear"
MOE_MODEL_TYPES = ("qwen3_vl_moe_text", "qwen3_vl_moe", "qwen3_moe")
# The expert settings of the 10B releases' config.json (R1 and 1.5; alpamayo-code-audit.md B.2): the real
# shapes for plans, benchmarks and tests (with the 8B VLM: 36 layers, 8 KV heads x 128, 2.28B parameters).
RELEASE_10B_EXPERT: dict[str, Any] = {
    "expert_cfg": {
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "head_dim": 128,
        "intermediate_size": 8256,
    },
    "action_in_proj_cfg": {
        "num_enc_layers": 2,
        "hidden_size": 512,
        "num_fourier_feats": 20,
        "max_freq": 100.0,
    },
    "action_out_proj_cfg": {},
    "diffusion_cfg": {"int_method": "euler", "num_inference_steps": 10},
    "expert_non_causal_attention": True,
}


@dataclass(frozen=True)
class WeightPrefixes:
    """Prefixes of the expert's tensors on disk (each ends with a dot)."""

    expert: str  # the transformer: `{expert}layers.{i}.…`, `{expert}norm.weight`
    in_proj: str  # `{in_proj}encoder.trunk.{0,2,3,…}.…`, `{in_proj}norm.{weight,bias}`, R1 `…freqs` buffers
    out_proj: str  # `{out_proj}weight` [action_dims, hidden], `{out_proj}bias` [action_dims]
    action_space: str  # R1's stored statistics `{action_space}{accel,curvature}_{mean,std}` (scalars)


FLAT_PREFIXES = WeightPrefixes("expert.", "action_in_proj.", "action_out_proj.", "action_space.")
SUPER_PREFIXES = WeightPrefixes(
    "expert.expert.", "expert.action_in_proj.", "expert.action_out_proj.", "expert.action_space."
)


@dataclass(frozen=True)
class InProjConfig:
    """`PerWaypointActionInProjV2`: Fourier features of each action dimension and of t, then an MLP.

    Defaults are NVIDIA's class defaults; the 10B releases set `num_enc_layers` 2 and `hidden_size` 512.
    """

    num_enc_layers: int = 4
    hidden_size: int = 1024
    num_fourier_feats: int = 20  # per encoded scalar: half sines, half cosines
    max_freq: float = 100.0

    @property
    def num_freqs(self) -> int:
        return self.num_fourier_feats // 2

    @property
    def num_features(self) -> int:
        """MLP input width: one Fourier encoding per action dimension plus one for t (60 for the releases)."""
        return (ACTION_DIMS + 1) * self.num_fourier_feats

    def trunk_layers(self) -> list[tuple[int, int]]:
        """`encoder.trunk` indices of each (RMSNorm, Linear) pair after its first Linear (index 0), one pair
        per encoder layer: (2 + 3 l, 3 + 3 l); the SiLUs at 1 + 3 l hold no tensors."""
        return [(2 + 3 * layer, 3 + 3 * layer) for layer in range(self.num_enc_layers)]


@dataclass(frozen=True)
class ExpertConfig:
    """Everything the action expert needs from `config.json`."""

    layout: str  # FLAT or SUPER
    text: TextConfig  # the expert transformer's dimensions
    text_dict: dict[
        str, Any
    ]  # the same as an HF-style text-config dict (builds transformers' model in tests)
    in_proj: InProjConfig
    prefixes: WeightPrefixes
    num_inference_steps: int = 10  # Euler steps
    non_causal: bool = True  # the 64 action tokens attend to each other bidirectionally
    out_proj_bias: bool = True
    # `diffusion_cfg.inference_guidance_weight`: navigation guidance's weight when none is given (NVIDIA's
    # FlowMatching default 1.0, pure guided)
    guidance_weight: float = 1.0
    # the initial-noise temperature navigation guidance runs at (Super: 1.0, as NVIDIA's guided example samples
    # it), None: any
    guided_temperature: float | None = None
    source: str = "config.json"

    def tensor_shapes(self) -> dict[str, list[tuple[int, ...]]]:
        """Every required tensor on disk -> its allowed shapes (the R1 `freqs` buffers are optional, not listed).

        The layers are the expert transformer's decoder layers (`TextConfig.layer_shapes`): a flat-layout
        expert over an MoE VLM copies the VLM's text config, so its sparse layers hold a router and fused
        experts, in either on-disk layout, as NVIDIA's `AutoModel.from_config` of that copy builds them."""
        t, p = self.text, self.prefixes
        shapes: dict[str, list[tuple[int, ...]]] = {}
        for i in range(t.num_hidden_layers):
            shapes.update(t.layer_shapes(i, f"{p.expert}layers.{i}."))
        shapes[f"{p.expert}norm.weight"] = [(t.hidden_size,)]
        shapes.update({name: [shape] for name, shape in self._in_proj_shapes().items()})
        shapes[f"{p.out_proj}weight"] = [(ACTION_DIMS, t.hidden_size)]
        if self.out_proj_bias:
            shapes[f"{p.out_proj}bias"] = [(ACTION_DIMS,)]
        return shapes

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every required tensor -> the one shape this stack writes and sizes (its first allowed shape: fused
        MoE experts in the released hub layout)."""
        return {name: allowed[0] for name, allowed in self.tensor_shapes().items()}

    def _in_proj_shapes(self) -> dict[str, tuple[int, ...]]:
        """`encoder.trunk` is Linear, SiLU, then (RMSNorm, Linear, SiLU) per extra layer, RMSNorm, Linear."""
        c, hidden, pre = self.in_proj, self.text.hidden_size, f"{self.prefixes.in_proj}encoder.trunk."
        shapes = {f"{pre}0.weight": (c.hidden_size, c.num_features), f"{pre}0.bias": (c.hidden_size,)}
        for layer, (norm, linear) in enumerate(c.trunk_layers()):
            out = hidden if layer == c.num_enc_layers - 1 else c.hidden_size
            shapes[f"{pre}{norm}.weight"] = (c.hidden_size,)
            shapes[f"{pre}{linear}.weight"] = (out, c.hidden_size)
            shapes[f"{pre}{linear}.bias"] = (out,)
        shapes[f"{self.prefixes.in_proj}norm.weight"] = (hidden,)
        shapes[f"{self.prefixes.in_proj}norm.bias"] = (hidden,)
        return shapes

    def freqs_keys(self) -> list[str]:
        """Names of R1's persistent Fourier `freqs` buffers ([1, num_freqs]): one per action dim, then t."""
        pre = self.prefixes.in_proj
        return [f"{pre}sinus.{i}.freqs" for i in range(ACTION_DIMS)] + [
            f"{pre}timestep_fourier_encoder.freqs"
        ]


def has_expert(raw: dict[str, Any]) -> bool:
    """Whether a raw `config.json` object describes an action expert (either layout)."""
    if isinstance(raw.get(SUPER_EXPERT_KEY), dict):
        # Super builds its expert only when `expert_config` carries an action space (`enable_expert`).
        return raw[SUPER_EXPERT_KEY].get("action_space_cfg") is not None
    return any(raw.get(k) is not None for k in FLAT_EXPERT_KEYS)


def expert_text_dict(
    raw: dict[str, Any], vlm_text: dict[str, Any] | None, source: str = "config.json"
) -> dict[str, Any]:
    """The expert transformer's HF-style text-config dict.

    Flat layout: a deep copy of the VLM's `text_config` dict `vlm_text` with each `expert_cfg` key set (as
    NVIDIA's `setattr` loop does). Super: `expert_config.llm_config` (its `text_config` when it is a full
    vision-language config). The dict parses with `alpamayo.config.model.parse_text_config` and builds
    transformers' `Qwen3VLTextModel(Qwen3VLTextConfig(**d))`.
    """
    root = Fields(raw, "", source)
    if root.has(SUPER_EXPERT_KEY):
        return copy.deepcopy(_super_llm(root).data)
    if vlm_text is None:
        raise ConfigError(
            f"{source}: the action expert's config is the VLM's text config with 'expert_cfg' applied, "
            "but no VLM text config was given"
        )
    out = copy.deepcopy(vlm_text)
    out.update(copy.deepcopy(root.optional_sub("expert_cfg").data))
    return out


def _super_llm(root: Fields) -> Fields:
    """Super's expert text config: `expert_config.llm_config`, or its `text_config` when it is a full
    vision-language config."""
    llm = root.sub(SUPER_EXPERT_KEY).sub("llm_config")
    return llm.sub("text_config") if llm.has("text_config") else llm


def _check_target(section: Fields, expected: str) -> None:
    """A Hydra `_target_` (when given) must name the class whose maths this package implements."""
    if section.has("_target_"):
        target = section.str("_target_")
        if target.rsplit(".", 1)[-1] != expected:
            raise ConfigError(
                f"{section.source}: unsupported '{section.name('_target_')}' = {target!r}; supported: "
                f"a class named {expected!r}"
            )


def _in_proj(section: Fields) -> InProjConfig:
    _check_target(section, IN_PROJ_TARGET)
    d = InProjConfig()
    cfg = InProjConfig(
        num_enc_layers=section.int("num_enc_layers", d.num_enc_layers),
        hidden_size=section.int("hidden_size", d.hidden_size),
        num_fourier_feats=section.int("num_fourier_feats", d.num_fourier_feats, minimum=2),
        max_freq=section.number("max_freq", d.max_freq, positive=True),
    )
    if cfg.num_fourier_feats % 2:
        raise section.fail("num_fourier_feats", "even (half sines, half cosines)")
    return cfg


def _diffusion(section: Fields, super_layout: bool) -> tuple[int, float]:
    """(Euler steps, guidance weight) of `diffusion_cfg` (NVIDIA's `FlowMatching` defaults: 10, 1.0)."""
    _check_target(section, DIFFUSION_TARGET)
    method = section.str("int_method", "euler")
    if method != "euler":
        raise ConfigError(
            f"{section.source}: unsupported '{section.name('int_method')}' = {method!r}; supported: 'euler'"
        )
    if super_layout and section.bool("use_classifier_free_guidance", False):
        raise ConfigError(
            f"{section.source}: '{section.name('use_classifier_free_guidance')}' = true, which NVIDIA's "
            "Alpamayo2Super refuses to load; its navigation guidance is asked for at sampling (--nav-guidance)"
        )
    weight = section.number("inference_guidance_weight", 1.0)
    return section.int("num_inference_steps", 10), weight


def parse_expert_config(
    raw: dict[str, Any],
    vlm_text: dict[str, Any] | None = None,
    source: str = "config.json",
    vlm_kind: str = "dense",
) -> ExpertConfig | None:
    """The expert of a raw `config.json` object, or None when it describes none (`has_expert`).

    `vlm_text` is the VLM's HF-style `text_config` dict (required for the flat R1 / 1.5 layout, whose expert
    copies it) and `vlm_kind` its "dense"/"moe" kind, which the copy inherits.
    """
    if not has_expert(raw):
        return None
    root = Fields(raw, "", source)
    super_layout = root.has(SUPER_EXPERT_KEY)
    settings = root.sub(SUPER_EXPERT_KEY) if super_layout else root
    text_dict = expert_text_dict(raw, vlm_text, source)
    if super_layout:
        text_fields = Fields(text_dict, _super_llm(root).path, source)
        kind = "moe" if text_dict.get("model_type") in MOE_MODEL_TYPES else "dense"
    else:
        text_fields = Fields(text_dict, "<VLM text_config + expert_cfg>", source)
        kind = vlm_kind
    out_proj = settings.optional_sub("action_out_proj_cfg")
    _check_target(out_proj, OUT_PROJ_TARGET)
    steps, weight = _diffusion(settings.optional_sub("diffusion_cfg"), super_layout)
    return ExpertConfig(
        layout=SUPER if super_layout else FLAT,
        text=parse_text_config(text_fields, kind),
        text_dict=text_dict,
        in_proj=_in_proj(settings.optional_sub("action_in_proj_cfg")),
        prefixes=SUPER_PREFIXES if super_layout else FLAT_PREFIXES,
        num_inference_steps=steps,
        non_causal=settings.bool("expert_non_causal_attention", True),
        out_proj_bias=out_proj.bool("bias", True),
        guidance_weight=weight,
        guided_temperature=1.0 if super_layout else None,
        source=source,
    )


def validate_against_vlm(expert: ExpertConfig, vlm: TextConfig) -> None:
    """The expert's layer ℓ attends over the VLM's layer-ℓ K/V cache: layer counts and K/V layouts must agree.

    Raises a ConfigError naming both values.
    """
    e = expert.text
    if e.num_hidden_layers != vlm.num_hidden_layers:
        raise ConfigError(
            f"{expert.source}: the action expert has {e.num_hidden_layers} layers but the VLM has "
            f"{vlm.num_hidden_layers}; each expert layer reads the VLM layer of the same index"
        )
    if (e.num_key_value_heads, e.head_dim) != (vlm.num_key_value_heads, vlm.head_dim):
        raise ConfigError(
            f"{expert.source}: the action expert's KV width {e.kv_dim} (num_key_value_heads "
            f"{e.num_key_value_heads} x head_dim {e.head_dim}) differs from the VLM's {vlm.kv_dim} "
            f"({vlm.num_key_value_heads} x {vlm.head_dim}); the expert attends over the VLM's K/V cache"
        )


def expert_config_of(cfg: ModelConfig) -> ExpertConfig | None:
    """The expert of a parsed checkpoint config (its top-level keys and the VLM's text config), or None."""
    return parse_expert_config(cfg.extra, cfg.raw_text_config, cfg.source, cfg.kind)

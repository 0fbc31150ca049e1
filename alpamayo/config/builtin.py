"""The configs bundled in `alpamayo/config/published/` and their lookup: published Qwen3-VL configs (hub
`config.json` spelling) for planning and benchmarks without weights, Alpamayo releases, MoE block configs.

Values from the hub config.json files of Qwen3-VL-2B/4B/8B/32B/30B-A3B/235B-A22B; the parameter totals they
imply (2.13B, 4.44B, 8.77B, 33.4B, 31.1B, 235.7B) match the published sizes. `<name>.moe.yaml` beside a
MoE model's config is its MoE block config (`block_config_for`).

`<name>.expert.yaml` is an Alpamayo release for planning: a built-in VLM config (`vlm`) plus the release's
top-level action-expert fields (`alpamayo.config.expert`); `builtin_expert(name)` parses both.
"""

from __future__ import annotations

from pathlib import Path

from alpamayo.config.expert import ExpertConfig, expert_config_of
from alpamayo.config.loader import load_model_config
from alpamayo.config.model import ModelConfig, TextConfig, parse_config
from alpamayo.config.moe import MoEBlockConfig
from alpamayo.errors import ConfigError
from alpamayo.json_fields import read_json

CONFIG_DIR = Path(__file__).resolve().parent / "published"
NAMES = sorted(p.stem for p in CONFIG_DIR.glob("*.json"))
EXPERT_SUFFIX = ".expert.yaml"
EXPERT_NAMES = sorted(p.name[: -len(EXPERT_SUFFIX)] for p in CONFIG_DIR.glob("*" + EXPERT_SUFFIX))
# One YAML per published MoE model, `<name>.moe.yaml`; a model whose dimensions match runs with it.
MOE_SUFFIX = ".moe.yaml"


def builtin_config(name: str) -> ModelConfig:
    """Config of a published model by name (e.g. 'qwen3-vl-2b'); see `NAMES`."""
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown built-in config {name!r}; available: {NAMES}")
    return load_model_config(path)


def builtin_expert(name: str) -> tuple[ModelConfig, ExpertConfig]:
    """The config and the action expert of an Alpamayo release by name (e.g. 'alpamayo-1.5-10b'); see
    `EXPERT_NAMES`."""
    import yaml

    path = CONFIG_DIR / f"{name}{EXPERT_SUFFIX}"
    if not path.is_file():
        raise ValueError(f"unknown built-in Alpamayo release {name!r}; available: {EXPERT_NAMES}")
    fields = yaml.safe_load(path.read_text())
    base = read_json(CONFIG_DIR / f"{fields['vlm']}.json")
    base["text_config"]["vocab_size"] = fields["vocab_size"]
    cfg = parse_config(fields["config"], f"{name}/config.json", base_vlm=base, base_model=fields["vlm"])
    expert = expert_config_of(cfg)
    if expert is None:
        raise ValueError(f"{path}: the release's fields describe no action expert")
    return cfg, expert


def shipped_block_configs() -> dict[str, MoEBlockConfig]:
    """The block configs shipped with the package, by model name (`published/<name>.moe.yaml`)."""
    paths = sorted(CONFIG_DIR.glob("*" + MOE_SUFFIX))
    return {path.name.removesuffix(MOE_SUFFIX): MoEBlockConfig.load(path) for path in paths}


def block_config_for(text: TextConfig, path: str | Path | None = None) -> MoEBlockConfig:
    """The MoE block config a model runs with, checked against the model's dimensions.

    `path` names a YAML file; without one, the shipped config whose dimensions are the model's (a
    Qwen3-VL-30B-A3B-shaped model gets `qwen3-vl-30b-a3b.moe.yaml`), else `MoEBlockConfig.for_text`.
    """
    model = MoEBlockConfig.for_text(text)
    if path is None:
        shipped = [c for c in shipped_block_configs().values() if _dims(c) == _dims(model)]
        return shipped[0] if shipped else model
    block = MoEBlockConfig.load(path)
    for field_name, model_value in zip(_DIMS, _dims(model), strict=True):
        if getattr(block, field_name) != model_value:
            raise ConfigError(
                f"{path}: {field_name} = {getattr(block, field_name)} but the checkpoint's text config has "
                f"{model_value}; an MoE block config must describe the model it runs"
            )
    return block


def model_block_config(
    text: TextConfig, moe: str | Path | MoEBlockConfig | None = None
) -> MoEBlockConfig | None:
    """The MoE block config a model runs with: `moe` (a config, or its YAML file) or `block_config_for`'s
    default; None for a model without MoE layers, for which a given `moe` is refused rather than ignored."""
    if text.moe is None:
        if moe is not None:
            given = "an MoEBlockConfig" if isinstance(moe, MoEBlockConfig) else repr(str(moe))
            raise ConfigError(
                f"MoE block config {given} given for a model without MoE layers (its text config names no "
                "experts); a block config applies to MoE checkpoints only"
            )
        return None
    return moe if isinstance(moe, MoEBlockConfig) else block_config_for(text, moe)


_DIMS = ("hidden_size", "intermediate_size", "num_routed_experts", "select_experts_k")


def _dims(cfg: MoEBlockConfig) -> tuple[int, ...]:
    return tuple(getattr(cfg, name) for name in _DIMS)

"""Published Qwen3-VL configs (hub `config.json` spelling) for planning and benchmarks without weights.

Values from the hub config.json files of Qwen3-VL-2B/4B/8B/32B/30B-A3B/235B-A22B; the parameter totals they
imply (2.13B, 4.44B, 8.77B, 33.4B, 31.1B, 235.7B) match the published sizes. `<name>.moe.yaml` beside a
MoE model's config is its MoE block config (`alpamayo.config.moe.block_config_for`).

`<name>.expert.yaml` is an Alpamayo release for planning: a built-in VLM config (`vlm`) plus the release's
top-level action-expert fields (`alpamayo.config.expert`); `builtin_expert(name)` parses both.
"""

from __future__ import annotations

from pathlib import Path

from alpamayo.config.expert import ExpertConfig, expert_config_of
from alpamayo.config.loader import load_model_config
from alpamayo.config.model import ModelConfig, parse_config
from alpamayo.json_fields import read_json

CONFIG_DIR = Path(__file__).resolve().parent
NAMES = sorted(p.stem for p in CONFIG_DIR.glob("*.json"))
EXPERT_SUFFIX = ".expert.yaml"
EXPERT_NAMES = sorted(p.name[: -len(EXPERT_SUFFIX)] for p in CONFIG_DIR.glob("*" + EXPERT_SUFFIX))


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

"""Published Qwen3-VL configs (hub `config.json` spelling) for planning and benchmarks without weights.

Values from the hub config.json files of Qwen3-VL-2B/4B/8B/32B/30B-A3B/235B-A22B; the parameter totals they
imply (2.13B, 4.44B, 8.77B, 33.4B, 31.1B, 235.7B) match the published sizes. `<name>.moe.yaml` beside a
MoE model's config is its MoE block config (`alpamayo.moe.config.block_config_for`).
"""

from __future__ import annotations

from pathlib import Path

from alpamayo.config import ModelConfig, load_config

CONFIG_DIR = Path(__file__).resolve().parent
NAMES = sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def builtin_config(name: str) -> ModelConfig:
    """Config of a published model by name (e.g. 'qwen3-vl-2b'); see `NAMES`."""
    path = CONFIG_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown built-in config {name!r}; available: {NAMES}")
    return load_config(path)

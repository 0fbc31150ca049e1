"""The base model of an Alpamayo 1 (R1) / 1.5 checkpoint, found offline.

Their `config.json` names a Hugging Face model (`vlm_name_or_path`, e.g. `nvidia/Cosmos-Reason2-8B`) whose
Qwen3-VL config, tokenizer, chat template and image processor the checkpoint reuses. Where it is looked for:

  --base-model DIR (`base_model=`; `model.base_model` in the node YAML), when given: that directory;
  otherwise (a) `vlm_name_or_path` as a local directory, absolute or relative to the checkpoint directory;
             (b) the local Hugging Face cache (`HF_HUB_CACHE`), with `local_files_only`: nothing is downloaded.

The directory must hold a tokenizer. Its `config.json` gives the Qwen3-VL config; where it has none and the id
is one of the two 8B bases the released checkpoints name, the bundled `alpamayo/config/published/qwen3-vl-8b.json`
serves (their configs are identical).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alpamayo.errors import ConfigError
from alpamayo.json_fields import read_json

# The bases of the released R1 / 1.5 checkpoints; both are Qwen3-VL-8B (Cosmos-Reason2-8B is a fine-tune).
KNOWN_8B_BASES = ("nvidia/Cosmos-Reason2-8B", "Qwen/Qwen3-VL-8B-Instruct")
# One of `alpamayo.config.builtin`'s files, found by path: the config package, above this one, reads configs
# through this package.
BUNDLED_8B = Path(__file__).resolve().parents[1] / "config" / "published" / "qwen3-vl-8b.json"
TOKENIZER_FILES = ("tokenizer.json", "vocab.json")


@dataclass(frozen=True)
class BaseModel:
    """A resolved base model: `directory` (tokenizer, chat template, optional preprocessor_config.json) and the
    Qwen3-VL `config` object with the file it came from, `how` it was found (for messages)."""

    name: str
    directory: Path
    config: dict[str, Any]
    config_source: Path
    how: str


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / f).is_file() for f in TOKENIZER_FILES)


def _local_directory(name: str, checkpoint_dir: Path) -> Path | None:
    for candidate in (Path(name).expanduser(), checkpoint_dir / name):
        if candidate.is_dir():
            return candidate.resolve()
    return None


def _cached_snapshot(name: str) -> Path | None:
    """The newest cached snapshot of hub repo `name`, or None; never touches the network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        path = snapshot_download(
            name, cache_dir=os.environ.get("HF_HUB_CACHE") or None, local_files_only=True
        )
    except (HFValidationError, LocalEntryNotFoundError, ValueError, OSError):
        return None
    return Path(path)


def resolve_base_model(
    name: str, checkpoint_dir: str | Path, explicit: str | Path | None = None, source: str = "config.json"
) -> BaseModel:
    """Find base model `name` (see the module docstring); ConfigError naming it and every way to provide it."""
    checkpoint_dir = Path(checkpoint_dir)
    if explicit is not None:
        directory, how = Path(explicit).expanduser(), "--base-model"
        if not directory.is_dir():
            raise ConfigError(f"--base-model {explicit}: no such directory (base model for {source})")
    else:
        directory, how = _local_directory(name, checkpoint_dir), "local directory"
        if directory is None:
            directory, how = _cached_snapshot(name), "Hugging Face cache"
        if directory is None:
            cache = os.environ.get("HF_HUB_CACHE") or "~/.cache/huggingface/hub"
            raise ConfigError(
                f"{source}: base model 'vlm_name_or_path' = {name!r} not found. Provide it one of three ways: "
                f"(a) a local directory {name!r}, absolute or relative to {checkpoint_dir}; "
                f"(b) the model in the local Hugging Face cache ({cache}; nothing is downloaded); "
                "(c) --base-model DIR (base_model= in from_checkpoint, model.base_model in the node YAML)"
            )
    if not _has_tokenizer(directory):
        raise ConfigError(
            f"{directory}: base model {name!r} ({how}) has no tokenizer.json or vocab.json; the checkpoint "
            "ships no tokenizer, so its base model's is needed"
        )
    config_path = directory / "config.json"
    if not config_path.is_file():
        if name not in KNOWN_8B_BASES:
            raise ConfigError(
                f"{directory}: base model {name!r} ({how}) has no config.json; only the known 8B bases "
                f"{list(KNOWN_8B_BASES)} fall back to the bundled {BUNDLED_8B.name}"
            )
        config_path = BUNDLED_8B
    config = read_json(config_path)
    if not isinstance(config, dict):
        raise ConfigError(f"{config_path}: the base model's config.json must hold a JSON object")
    return BaseModel(name, directory, config, config_path, how)

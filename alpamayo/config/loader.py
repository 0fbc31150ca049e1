"""One loader for every model family: `config.json` -> family -> `ModelConfig`, tokenizer, checks.

    cfg = load_model_config(ckpt_dir, base_model=None)   # the config; checks the action expert's config
                                                         # against the VLM's
    tokenizer = model_tokenizer(cfg)                     # shipped, or the base model's extended
    check_checkpoint(ckpt, cfg)                          # headers only, before any weight is read

R1 / 1.5: the base model (`alpamayo.families.base_model`) gives the Qwen3-VL config and the tokenizer; the
tokenizer is extended (`alpamayo.families.vocabulary`) and the config's vocabulary set to its length, as
NVIDIA's `ReasoningVLAConfig` does. Their EOS ids come from the checkpoint's generation_config.json, else the
base model's.

Super: the checkpoint's own tokenizer, completed as NVIDIA's `build_alpamayo2_super_tokenizer` completes it at
every load (the `<iN>` then the markers it lacks; one line on stderr when anything was added), and checked
against the ids config.json's `traj_ids` saved, which NVIDIA's model uses.
"""

from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path
from typing import Any

from alpamayo.config.expert import expert_config_of, validate_against_vlm
from alpamayo.config.model import ModelConfig, generation_eos, parse_config
from alpamayo.errors import ConfigError
from alpamayo.families.base_model import BUNDLED_8B, KNOWN_8B_BASES, resolve_base_model
from alpamayo.families.registry import RELEASE_IDS, Family, detect_family
from alpamayo.families.vocabulary import (
    bin_token,
    check_embedding_rows,
    complete_tokenizer,
    extend_tokenizer,
    marker,
)
from alpamayo.json_fields import Fields, read_json
from alpamayo.tokenizer import load_tokenizer

EMBEDDING = "language_model.embed_tokens.weight"


def _config_path(path: str | Path) -> tuple[Path, Path]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: checkpoint directory does not exist")
    directory = path if path.is_dir() else path.parent
    cfg_path = path / "config.json" if path.is_dir() else path
    if not cfg_path.is_file():
        raise ConfigError(f"{cfg_path}: no config.json in checkpoint directory {directory}")
    return directory, cfg_path


def _extension(raw: dict[str, Any], source: str) -> tuple[int, bool]:
    """(traj_vocab_size, add_special_tokens) of an R1 / 1.5 config (NVIDIA's class default for the flag)."""
    root = Fields(raw, "", source)
    return root.int("traj_vocab_size"), root.bool("add_special_tokens", False)


@functools.lru_cache(maxsize=4)
def _extended_tokenizer(
    directory: str, traj_vocab_size: int, markers: tuple[str, ...], add_special_tokens: bool
) -> Any:
    """The base model's tokenizer extended once per process (the real one takes ~1 s to extend)."""
    return extend_tokenizer(load_tokenizer(directory), traj_vocab_size, markers, add_special_tokens)


def _read_config(cfg_path: Path) -> dict[str, Any]:
    raw = read_json(cfg_path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{cfg_path}: config.json must hold a JSON object, got {type(raw).__name__}")
    return raw


def checkpoint_family(path: str | Path) -> Family:
    """The family of a checkpoint directory (or config file) from its config.json alone: no base model, no
    tokenizer, no weights. ConfigError naming the file when it is missing or not a JSON object."""
    return detect_family(_read_config(_config_path(path)[1]))


def load_model_config(path: str | Path, base_model: str | Path | None = None) -> ModelConfig:
    """`ModelConfig` of a checkpoint directory (or config file) of any family; `base_model` is the explicit
    base-model directory for R1 / 1.5 (ignored, and refused, for the families that need none)."""
    directory, cfg_path = _config_path(path)
    source = str(cfg_path)
    raw = _read_config(cfg_path)
    family = detect_family(raw)
    eos = generation_eos(directory) if family.generation_eos else ()
    if not family.uses_base_model:
        if base_model is not None:
            raise ConfigError(
                f"--base-model {base_model}: {source} is a {family.title} checkpoint, which needs no base "
                "model (only Alpamayo 1 (R1) and 1.5 checkpoints name one)"
            )
        return _check_expert(parse_config(raw, source, eos))
    name = Fields(raw, "", source).str("vlm_name_or_path")
    base = resolve_base_model(name, directory, base_model, source)
    traj_vocab_size, add_special = _extension(raw, source)
    tokenizer = _extended_tokenizer(str(base.directory), traj_vocab_size, family.markers, add_special)
    _check_saved_ids(raw, source, tokenizer, base.directory)
    vlm = copy.deepcopy(base.config)
    vlm.setdefault("text_config", {})
    if not isinstance(vlm["text_config"], dict):
        raise ConfigError(f"{base.config_source}: field 'text_config' must be a JSON object")
    vlm["text_config"]["vocab_size"] = vlm["vocab_size"] = len(tokenizer)
    cfg = parse_config(
        raw, source, eos or generation_eos(base.directory), base_vlm=vlm, base_model=str(base.directory)
    )
    return _check_expert(cfg)


def load_shape_config(path: str | Path, base_model: str | Path | None = None) -> ModelConfig:
    """The config with its shapes, for planning (no weights, no tokenizer needed): `load_model_config`, except
    that an R1 / 1.5 checkpoint whose base model is not on disk, when it names one of the two known 8B bases
    and saves its `vocab_size` (NVIDIA's config derives and saves it), takes the bundled Qwen3-VL-8B config
    with that vocabulary, as `alpamayo.families.base_model` does for a base without config.json."""
    directory, cfg_path = _config_path(path)
    raw = _read_config(cfg_path)
    if base_model is not None or not detect_family(raw).uses_base_model:
        return load_model_config(path, base_model)
    source = str(cfg_path)
    name = Fields(raw, "", source).str("vlm_name_or_path")
    try:
        resolve_base_model(name, directory, None, source)
    except ConfigError:
        if name not in KNOWN_8B_BASES:
            raise
    else:
        return load_model_config(path)
    vocab_size = raw.get("vocab_size")
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1:
        raise ConfigError(
            f"{source}: base model {name!r} is not on disk and field 'vocab_size' is {vocab_size!r}: without "
            "the base model's tokenizer the vocabulary is unknown; give --base-model DIR"
        )
    vlm = read_json(BUNDLED_8B)
    vlm["text_config"]["vocab_size"] = vlm["vocab_size"] = vocab_size
    return _check_expert(parse_config(raw, source, generation_eos(directory), base_vlm=vlm, base_model=None))


def _check_expert(cfg: ModelConfig) -> ModelConfig:
    """The action expert (when the config has one) reads the VLM's KV cache layer by layer: refuse a config
    whose layer count or KV width differs, before any weight is read."""
    expert = expert_config_of(cfg)
    if expert is not None:
        validate_against_vlm(expert, cfg.text)
    return cfg


def _check_saved_ids(raw: dict[str, Any], source: str, tokenizer: Any, base_dir: Path) -> None:
    """NVIDIA's config saves the ids it derived from its tokenizer (`vocab_size`, `traj_token_start_idx`):
    where present they must be the extended base tokenizer's, or the base model is not the one trained on."""
    found = {
        "vocab_size": len(tokenizer),
        "traj_token_start_idx": tokenizer.convert_tokens_to_ids(bin_token(0)),
    }
    for key, value in found.items():
        saved = raw.get(key)
        if isinstance(saved, int) and saved != value:
            raise ConfigError(
                f"{source}: field '{key}' = {saved}, but the tokenizer of base model {base_dir}, extended, "
                f"gives {value}; the checkpoint was trained on another base model"
            )


def model_tokenizer(cfg: ModelConfig) -> Any:
    """The tokenizer of a loaded config: the checkpoint's own (Super: completed, see the module docstring), or
    (R1 / 1.5) the extended base tokenizer."""
    family = cfg.family
    if family.uses_base_model:
        traj_vocab_size, add_special = _extension(cfg.extra, cfg.source)
        return _extended_tokenizer(cfg.base_model, traj_vocab_size, family.markers, add_special)
    directory = Path(cfg.source).parent
    if family.markers is None:
        return load_tokenizer(directory)
    root = Fields(cfg.extra, "", cfg.source)
    # NVIDIA's `Alpamayo2SuperConfig` defaults
    history, future = root.int("history_vocab_size", 1000), root.int("future_vocab_size", 3000)
    tokenizer = _completed_tokenizer(
        str(directory), _tokenizer_files(directory), history + future, family.markers, family.title
    )
    _check_traj_ids(root, tokenizer, history)
    return tokenizer


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "added_tokens.json")


def _tokenizer_files(directory: Path) -> tuple[tuple[str, int, int], ...]:
    """(name, mtime ns, size) of the tokenizer files present: the cache key changes when they do."""
    stats = ((name, directory / name) for name in TOKENIZER_FILES)
    return tuple((name, p.stat().st_mtime_ns, p.stat().st_size) for name, p in stats if p.is_file())


@functools.lru_cache(maxsize=4)
def _completed_tokenizer(
    directory: str,
    files: tuple[tuple[str, int, int], ...],
    traj_vocab_size: int,
    markers: tuple[str, ...],
    title: str,
) -> Any:
    """The checkpoint's tokenizer completed once per process (and per version of its files, `files`)."""
    del files  # the cache key only
    tokenizer = load_tokenizer(directory)
    added = complete_tokenizer(tokenizer, traj_vocab_size, markers)
    if added:
        print(
            f"alpamayo: {directory}: the tokenizer lacks {added} of {title}'s trajectory tokens and markers; "
            f"added at load as NVIDIA's code adds them (<i0>..<i{traj_vocab_size - 1}>, then the markers)",
            file=sys.stderr,
        )
    return tokenizer


# config.json `traj_ids` key -> the token NVIDIA's config derives it from (`_build_traj_ids`; `future_id0` is
# `<i{history_vocab_size}>`).
TRAJ_ID_TOKENS = {
    "history_pad": marker("traj_history"),
    "future_pad": marker("traj_future"),
    "history_start": marker("traj_history_start"),
    "future_start": marker("traj_future_start"),
    "history_end": marker("traj_history_end"),
    "future_end": marker("traj_future_end"),
    "history_id0": bin_token(0),
}


def _check_traj_ids(root: Fields, tokenizer: Any, history: int) -> None:
    """NVIDIA's Super model takes its trajectory ids from config.json's saved `traj_ids`, the project from the
    tokenizer: where saved they must agree, or the checkpoint's tokenizer is not the one it was trained with."""
    saved = root.optional_sub("traj_ids").data
    tokens = dict(TRAJ_ID_TOKENS, future_id0=bin_token(history))
    for key, token in tokens.items():
        value, found = saved.get(key), tokenizer.convert_tokens_to_ids(token)
        if isinstance(value, int) and not isinstance(value, bool) and value != found:
            raise ConfigError(
                f"{root.source}: field 'traj_ids.{key}' = {value}, but the checkpoint's tokenizer gives {token} "
                f"id {found}; the tokenizer is not the one the model was trained with"
            )


def check_checkpoint(ckpt: Any, cfg: ModelConfig) -> None:
    """What can be checked from the safetensors headers before any weight is read: the embedding table has
    the rows the family's tokenizer needs (R1 / 1.5: exactly its length). `ckpt` is an open `Checkpoint`."""
    if cfg.family_name not in RELEASE_IDS or EMBEDDING not in ckpt:
        return  # the project's own layouts pair their files themselves; a missing table is the weight check's
    entry = ckpt.entry(EMBEDDING)
    tokenizer = model_tokenizer(cfg)
    origin = f"base model {cfg.base_model}, extended" if cfg.family.uses_base_model else "the checkpoint's"
    check_embedding_rows(
        len(tokenizer), entry.shape[0], cfg.family.exact_vocab, origin, entry.key, str(entry.file)
    )

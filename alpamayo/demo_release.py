"""Tiny random checkpoints laid out exactly as NVIDIA ships its Alpamayo releases (`make_demo_checkpoint`'s
"r1", "alpamayo1.5" and "super" layouts), so every loading path runs offline on a few MB.

R1 / 1.5 (`nvidia/Alpamayo-R1-10B`, `nvidia/Alpamayo-1.5-10B`):
  OUT/config.json          flat `AlpamayoR1Config` / `Alpamayo1_5Config` fields, Hydra `_target_` blocks, the
                           derived `vocab_size` / `traj_token_start_idx` / `traj_token_ids`; no VLM config
  OUT/model-0000N-of-00003.safetensors + model.safetensors.index.json
                           `vlm.model.language_model.*`, `vlm.model.visual.*`, `vlm.lm_head.weight`, the action
                           expert `expert.layers.*`, `expert.norm.weight`, `action_in_proj.*`, `action_out_proj.*`;
                           R1 also its persistent buffers `action_space.*` and `action_in_proj.*.freqs`
  no tokenizer, processor or generation files: they come from the base model
  BASE/ (default OUT-base, named by `vlm_name_or_path` relative to OUT): the base model's tokenizer (Qwen
                           tokens only, chat template), Qwen3-VL config.json (vocabulary padded to a multiple
                           of 64, as Qwen's 151936), preprocessor_config.json (Qwen3-VL's), generation_config.json
Super (`nvidia/Alpamayo2-Super`): config.json with the nested `vlm_config` (vocabulary padded to a multiple of
  128) and `expert_config` (`llm_config` + action settings), `future_traj_tokenizer_cfg`, 45 history tokens;
  its tokenizer (R1 marker names, history bins first) and preprocessor_config.json in OUT; expert weights under
  `expert.expert.*`, `expert.action_in_proj.*`, `expert.action_out_proj.*`.
Expert weights are transformers' `Qwen3VLTextModel` for the expert config (no `embed_tokens`) plus the
projections `alpamayo.config.expert.ExpertConfig.weight_shapes` lists; all are seeded float32.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import torch

from alpamayo.config.expert import ExpertConfig
from alpamayo.demo_checkpoint import (
    DIFFUSION,
    EXPERT_CFG,
    IN_PROJ,
    MAX_PIXELS,
    MIN_PIXELS,
    PREPROCESSOR,
    action_space_fields,
    base_tokenizer,
    build_tokenizer,
    check_output_dir,
    future_tokenizer_fields,
    generation_config,
    model_weights,
    vlm_config,
    write_demo_layout,
    write_json,
)
from alpamayo.families.registry import ALPAMAYO_1_5, FAMILIES, R1, RELEASE_IDS, SUPER
from alpamayo.families.vocabulary import bin_token, marker
from alpamayo.plan.device_spec import round_up
from planner.settings import PlannerSettings

NUM_SHARDS = 3
# Python package of each release's classes, for the Hydra `_target_` strings (read as data, never imported).
PACKAGES = {R1.name: "alpamayo_r1", ALPAMAYO_1_5.name: "alpamayo1_5", SUPER.name: "alpamayo2_super"}
BASE_VOCAB_MULTIPLE = 64  # Qwen3-VL's 151936 embedding rows for its 151669 tokens
SUPER_VOCAB_MULTIPLE = 128  # Super rounds its vocabulary up to a multiple of 128 ([A2-src] config.py)
# Qwen3-VL's own processor (what the base model ships; Alpamayo overrides the pixel bounds from config.json).
BASE_PREPROCESSOR = dict(
    PREPROCESSOR,
    size={"shortest_edge": 65536, "longest_edge": 16777216},
    min_pixels=65536,
    max_pixels=16777216,
)


def _target(package: str, path: str, **fields: Any) -> dict[str, Any]:
    return {"_target_": f"{package}.{path}", **fields}


def _action_space(package: str) -> dict[str, Any]:
    return _target(package, "action_space.UnicycleAccelCurvatureActionSpace", **action_space_fields())


def _expert_blocks(package: str) -> dict[str, Any]:
    """The four expert settings both layouts share, with the release key names."""
    return {
        "action_space_cfg": _action_space(package),
        "diffusion_cfg": _target(package, "diffusion.flow_matching.FlowMatching", **DIFFUSION),
        "action_in_proj_cfg": _target(package, "models.action_in_proj.PerWaypointActionInProjV2", **IN_PROJ),
        "action_out_proj_cfg": {"_target_": "torch.nn.Linear"},
        "expert_non_causal_attention": True,
    }


def _traj_ids(tokenizer: Any) -> dict[str, int]:
    """`traj_token_ids` as `ReasoningVLAConfig` derives and saves it."""
    names = ("history", "future", "history_start", "future_start", "history_end", "future_end")
    spelled = {n: marker(f"traj_{n}") for n in names}
    return {n: tokenizer.convert_tokens_to_ids(t) for n, t in spelled.items()}


def flat_config(family: str, tokenizer: Any, vlm_name_or_path: str) -> dict[str, Any]:
    """config.json of an R1 / 1.5 checkpoint for the extended `tokenizer` (derived fields included)."""
    package, planner = PACKAGES[family], PlannerSettings()
    arch, model_type = RELEASE_IDS[family]
    config = {
        "architectures": [arch],
        "model_type": model_type,
        "transformers_version": "4.57.1",
        "vlm_name_or_path": vlm_name_or_path,
        "vlm_backend": "qwenvl3",
        "model_dtype": "bfloat16",
        "attn_implementation": "flash_attention_2",
        "traj_tokenizer_cfg": _target(
            package,
            "action_space.discrete_action_space.DiscreteTrajectoryTokenizer",
            _recursive_=False,
            action_space_cfg=_action_space(package),
            **future_tokenizer_fields(),
        ),
        "hist_traj_tokenizer_cfg": _target(
            package, "models.delta_tokenizer.DeltaTrajectoryTokenizer", num_bins=planner.history.num_bins
        ),
        "traj_vocab_size": planner.traj_vocab_size,
        "tokens_per_history_traj": planner.history.num_tokens,
        "tokens_per_future_traj": planner.tokens_per_future,
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "add_special_tokens": True,
        "expert_cfg": dict(EXPERT_CFG),
        "keep_same_dtype": True,
        **_expert_blocks(package),
        "vocab_size": len(tokenizer),
        "traj_token_start_idx": tokenizer.convert_tokens_to_ids(bin_token(0)),
        "traj_token_ids": _traj_ids(tokenizer),
    }
    if family == ALPAMAYO_1_5.name:
        # NVIDIA's class defaults; its helper labels cameras and frames whatever they say (planner.prompt).
        config.update(include_camera_ids=False, include_frame_nums=False)
    return config


def super_config(tokenizer: Any) -> dict[str, Any]:
    """config.json of an Alpamayo 2 Super checkpoint: nested VLM (vocabulary padded to 128) and expert."""
    package, planner = PACKAGES[SUPER.name], PlannerSettings()
    vlm = vlm_config(tokenizer, round_up(len(tokenizer), SUPER_VOCAB_MULTIPLE))
    llm = dict(copy.deepcopy(vlm["text_config"]), **EXPERT_CFG, model_type="qwen3_vl_text")
    history, future = planner.history.num_bins, planner.future.num_bins
    ids = tokenizer.convert_tokens_to_ids
    return {
        "architectures": ["Alpamayo2Super"],
        "model_type": "alpamayo2_super",
        "transformers_version": "4.57.1",
        "vlm_name_or_path": "Qwen/Qwen3-VL-32B-Instruct",
        "vlm_class": "Qwen3VLForConditionalGeneration",
        "vlm_config": vlm,
        "expert_config": {"llm_config": llm, **_expert_blocks(package)},
        "hist_traj_tokenizer_cfg": _target(
            package,
            "models.delta_tokenizer.DeltaTrajectoryTokenizer",
            num_bins=history,
            pad_origin_at_beginning=False,
        ),
        "future_traj_tokenizer_cfg": _target(
            package,
            "action_space.discrete_action_space.DiscreteTrajectoryTokenizer",
            _recursive_=False,
            **future_tokenizer_fields(),
        ),
        "history_vocab_size": history,
        "future_vocab_size": future,
        "traj_vocab_size": history + future,
        "dtype": "bfloat16",
        "padding_side": "left",
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "include_camera_ids": True,
        "token_layout": "camera_ts",
        "frame_label": "frame_num",
        "include_frame_nums": True,
        "tokens_per_history_traj": 3 * 15,
        "tokens_per_future_traj": planner.tokens_per_future,
        "traj_ids": {
            "history_pad": ids(marker("traj_history")),
            "future_pad": ids(marker("traj_future")),
            "history_start": ids(marker("traj_history_start")),
            "future_start": ids(marker("traj_future_start")),
            "history_end": ids(marker("traj_history_end")),
            "future_end": ids(marker("traj_future_end")),
            "history_id0": ids(bin_token(0)),
            "future_id0": ids(bin_token(history)),
        },
        "enable_expert": True,
    }


def r1_buffers(expert: ExpertConfig, action_space: dict[str, Any]) -> dict[str, torch.Tensor]:
    """R1's persistent buffers: the in-projection's Fourier `freqs` (float32 logspace, as R1 stores them) and
    the action-space statistics `action_space.{accel,curvature}_{mean,std}`."""
    freqs = torch.logspace(0, math.log10(expert.in_proj.max_freq), expert.in_proj.num_freqs)[None, :]
    out = {name: freqs.clone() for name in expert.freqs_keys()}
    stats = ("accel_mean", "accel_std", "curvature_mean", "curvature_std")
    out.update({f"action_space.{k}": torch.tensor(float(action_space[k])) for k in stats})
    return out


def write_shards(out: Path, weights: dict[str, torch.Tensor], num_shards: int = NUM_SHARDS) -> None:
    """`model-0000N-of-0000M.safetensors` (tensors in name order, split by bytes) and the index, as
    transformers' `save_pretrained` writes a sharded checkpoint."""
    from safetensors.torch import save_file

    names = sorted(weights)
    total = sum(weights[n].numel() * weights[n].element_size() for n in names)
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    done = 0
    for name in names:
        shards[min(num_shards - 1, done * num_shards // total)].append(name)
        done += weights[name].numel() * weights[name].element_size()
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors"
        save_file({n: weights[n] for n in shard}, str(out / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in shard})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def write_base_model(directory: Path) -> Any:
    """The tiny base model R1 / 1.5 name: tokenizer, Qwen3-VL config, processor and generation settings (no
    weights: NVIDIA's loader builds the VLM from its config and loads the checkpoint's). Returns the tokenizer."""
    check_output_dir(directory, "the demo base model")
    tokenizer = base_tokenizer()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(directory)
    padded = round_up(len(tokenizer), BASE_VOCAB_MULTIPLE)
    write_json(directory / "config.json", vlm_config(tokenizer, padded))
    write_json(directory / "preprocessor_config.json", BASE_PREPROCESSOR)
    write_json(directory / "generation_config.json", generation_config(tokenizer))
    return tokenizer


LAYOUTS = ("demo", "r1", "alpamayo1.5", "super")  # the project's, then each release's as NVIDIA ships it


def make_demo_checkpoint(
    out: str | Path, seed: int = 0, layout: str = "demo", base_model_out: str | Path | None = None
) -> Path:
    """Write the demo checkpoint into `out` (a new or empty directory) in `layout` (`LAYOUTS`); returns its
    path. R1 / 1.5 layouts also write their base model, into `base_model_out` (default: `<out>-base` beside
    `out`), which config.json's `vlm_name_or_path` names relative to `out`."""
    out = Path(out)
    if layout not in LAYOUTS:
        raise ValueError(f"unknown demo checkpoint layout {layout!r}; allowed: {', '.join(LAYOUTS)}")
    check_output_dir(out)
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed must be in [0, 2**63), got {seed}")
    if layout == "demo":
        return write_demo_layout(out, seed)
    return make_release_checkpoint(out, seed, layout, base_model_out)


def make_release_checkpoint(out: Path, seed: int, layout: str, base_model_out: str | Path | None) -> Path:
    """See the module docstring; `make_demo_checkpoint` checks the arguments first."""
    family = FAMILIES[layout]
    if family.uses_base_model:
        base_dir = Path(base_model_out) if base_model_out is not None else out.parent / f"{out.name}-base"
        tokenizer = build_tokenizer(family.markers, write_base_model(base_dir))
        name = str(base_dir.resolve()) if base_model_out is not None else f"../{base_dir.name}"
        config = flat_config(layout, tokenizer, name)
        vlm = vlm_config(tokenizer)
    else:
        tokenizer = build_tokenizer(family.markers)  # Super: the checkpoint ships it complete
        config = super_config(tokenizer)
        vlm = config["vlm_config"]
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", config)
    if not family.uses_base_model:
        tokenizer.save_pretrained(out)
        write_json(out / "preprocessor_config.json", PREPROCESSOR)
    weights, expert = model_weights(config, vlm, str(out / "config.json"), seed)
    if layout == R1.name:
        weights.update(r1_buffers(expert, config["action_space_cfg"]))
    write_shards(out, weights)
    return out

"""Reading the action expert's tensors (every family's names, `ExpertConfig.prefixes`) into `ActionExpert`.

Everything is checked before the first tensor is read: the expert against the VLM (layer count, K/V layout),
then every name and shape against the config (all problems reported at once, each naming tensor and file).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from alpamayo.checkpoint import Checkpoint, Getter, Shape
from alpamayo.config.expert import ExpertConfig, validate_against_vlm
from alpamayo.config.model import TextConfig
from alpamayo.errors import CheckpointError
from alpamayo.expert.in_proj import ActionInProj, default_freqs
from alpamayo.expert.model import ActionExpert
from alpamayo.prediction import FUTURE_STEPS
from alpamayo.quant import PART_NAMES, QuantRecipe
from alpamayo.quant.cache import PackedWeightCache
from alpamayo.text.linear import Linear, pack_linears
from alpamayo.text.norm import RMSNorm
from alpamayo.text.weights import build_layer


def expected_tensors(ckpt: Checkpoint, cfg: ExpertConfig) -> dict[str, list[Shape]]:
    """Name -> allowed shapes of every expert tensor, plus R1's `freqs` buffers where the checkpoint has them."""
    shapes = cfg.tensor_shapes()
    for name in cfg.freqs_keys():
        if name in ckpt:
            shapes[name] = [(1, cfg.in_proj.num_freqs), (cfg.in_proj.num_freqs,)]
    return shapes


ACTION_STATISTICS = ("accel_mean", "accel_std", "curvature_mean", "curvature_std")


def stored_action_statistics(ckpt: Checkpoint, cfg: ExpertConfig) -> dict[str, float] | None:
    """The action-space statistics a release stores, by `ActionSpaceSettings` field name, or None when it
    stores none (then the config's `action_space_cfg` values serve).

    NVIDIA's rule: R1 builds `action_space` from `config.action_space_cfg` with persistent buffers
    `{accel,curvature}_{mean,std}`, `from_pretrained` then overwrites them with the checkpoint's tensors, and
    `action_to_traj` un-normalises the expert's output with those. A bf16 release stores them bf16-rounded
    (`accel_std` 0.6797 against 0.68104 in config.json), so those are the numbers the model was run with.
    1.5 registers them non-persistent (never stored). CheckpointError for a partial set, a non-scalar, a
    non-finite value or a std <= 0."""
    names = {k: f"{cfg.prefixes.action_space}{k}" for k in ACTION_STATISTICS}
    held = [n for n in names.values() if n in ckpt]
    if not held:
        return None
    if len(held) != len(names):
        missing = sorted(set(names.values()) - set(held))
        raise CheckpointError(
            f"{ckpt.directory}: action-space statistics {held} are stored but not {missing}"
        )
    stats: dict[str, float] = {}
    for field, name in names.items():
        if ckpt.shape(name) not in ((), (1,)):
            raise CheckpointError(
                f"{ckpt.directory}: {name} has shape {list(ckpt.shape(name))}, expected a scalar"
            )
        value = float(ckpt.get(name, torch.float64).reshape(()))
        if not math.isfinite(value) or (field.endswith("_std") and value <= 0):
            raise CheckpointError(f"{ckpt.directory}: {name} = {value}; expected a finite value (a std > 0)")
        stats[field] = value
    return stats


def has_expert_weights(ckpt: Checkpoint, cfg: ExpertConfig) -> bool:
    """Whether the checkpoint holds any expert tensor (the default decoder is the expert exactly then)."""
    return any(ckpt.names(prefix) for prefix in _namespaces(cfg))


def _namespaces(cfg: ExpertConfig) -> tuple[str, ...]:
    p = cfg.prefixes
    return (f"{p.expert}layers.", f"{p.expert}norm.", p.in_proj, p.out_proj)


def validate_expert_tensors(ckpt: Checkpoint, cfg: ExpertConfig, vlm: TextConfig) -> None:
    """ConfigError if the expert cannot read the VLM's cache; CheckpointError naming every missing, mis-shaped
    or unexpected expert tensor. Reads headers only."""
    validate_against_vlm(cfg, vlm)
    ckpt.validate(expected_tensors(ckpt, cfg), _namespaces(cfg))


def load_expert(
    source: str | Path | Checkpoint,
    cfg: ExpertConfig,
    vlm: TextConfig,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    n_tokens: int = FUTURE_STEPS,
    weight_prefix: str = "",
    quant: QuantRecipe | None = None,
    quant_cache: PackedWeightCache | None = None,
) -> ActionExpert:
    """The expert of checkpoint `source` (a directory, or a `Checkpoint` shared with the VLM), validated first.

    `n_tokens`: action tokens per sample (the action space's waypoints). The in-projection's Fourier
    frequencies are R1's stored buffers where present, else NVIDIA's bfloat16-rounded table (`default_freqs`).
    `quant`: weight-only quantisation of the linears, through `quant_cache` (`alpamayo.quant.cache`) when given.
    """
    ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source, weight_prefix)
    validate_expert_tensors(ckpt, cfg, vlm)
    freqs = [
        ckpt.get(name, torch.float32, device) if name in ckpt else default_freqs(cfg.in_proj).to(device)
        for name in cfg.freqs_keys()
    ]
    return build_expert(cfg, ckpt.getter(dtype, device), freqs, n_tokens, quant, quant_cache)


def build_expert(
    cfg: ExpertConfig,
    get: Getter,
    freqs: list[torch.Tensor],
    n_tokens: int = FUTURE_STEPS,
    quant: QuantRecipe | None = None,
    quant_cache: PackedWeightCache | None = None,
) -> ActionExpert:
    """The expert from tensors by checkpoint name (`get(name)`, in the model's dtype and device; not
    validated: `load_expert` validates first) and its Fourier `freqs` (one [num_freqs] table per
    `cfg.freqs_keys()` entry), its linears packed (quantised by `quant` where it applies, through
    `quant_cache` when given)."""
    t, p, c = cfg.text, cfg.prefixes, cfg.in_proj
    layers = [build_layer(t, i, get, f"{p.expert}layers.{i}.") for i in range(t.num_hidden_layers)]
    trunk, pairs = f"{p.in_proj}encoder.trunk.", c.trunk_layers()
    in_proj = ActionInProj(
        freqs,
        [(get(f"{trunk}{i}.weight"), get(f"{trunk}{i}.bias")) for i in [0] + [lin for _, lin in pairs]],
        [get(f"{trunk}{norm}.weight") for norm, _ in pairs],
        (get(f"{p.in_proj}norm.weight"), get(f"{p.in_proj}norm.bias")),
    )
    out_bias = get(f"{p.out_proj}bias") if cfg.out_proj_bias else None
    expert = ActionExpert(
        cfg,
        layers,
        RMSNorm(get(f"{p.expert}norm.weight"), t.rms_norm_eps),
        in_proj,
        Linear(get(f"{p.out_proj}weight"), out_bias, role="head"),
        n_tokens,
    )
    pack_linears(expert, quant=quant, cache=quant_cache, part=PART_NAMES["expert"])
    return expert.eval()

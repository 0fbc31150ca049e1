"""A ttnn recipe's figures as its device programs compute them in the ttnn golden mode (`alpamayo precision
--golden`; needs ttnn, no card).

`alpamayo.tt.golden` runs ttnn's golden functions on the host, with bf16 and block-float activations and K/V as
the device holds them: final-logit PCC and teacher-forced top-1 (the prompt and the continuation in one device
prefill, `prefill_block`, which scores the continuation's rows), vision tower PCC, the action expert's waypoint
drift (its device sampling over the device's cache of those rows from the same noise) and, with a drive, the
trajectory token agreement, ADE drift and ADE of the `--backend ttnn --tt-mode golden` runtime. Where these part
from the emulated figures beside them (`alpamayo.precision.recipes`), the device program computes something
other than the recipe's rounding alone: that is a finding.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from alpamayo.backends import BackendOptions
from alpamayo.checkpoint import Checkpoint
from alpamayo.config.expert import expert_config_of
from alpamayo.config.loader import load_model_config
from alpamayo.config.model import ModelConfig
from alpamayo.model_spec import ModelSpec
from alpamayo.numerics import pcc
from alpamayo.plan.precision import Precision
from alpamayo.precision.drives import DriveRun, drive_figures, drive_run
from alpamayo.precision.expert import expert_noise, waypoint_drift
from alpamayo.precision.reference import Reference, top1_agreement, vision_pcc
from alpamayo.precision.settings import Progress, Settings


def golden_figures(
    directory: Path,
    precision: Precision,
    ref: Reference,
    settings: Settings,
    ticks: Sequence[Any],
    base_model: str | None = None,
    progress: Progress = lambda message: None,
) -> dict[str, Any]:
    """The recipe's figures as its device programs compute them in the ttnn golden mode (module docstring):
    logits_pcc, top1_agreement, vision_pcc, expert_ade_drift_m and drive (`drive_figures`, None without one)."""
    label = f"recipe {precision.name} (golden mode)"
    progress(f"{label}: teacher-forced logits on the device programs")
    cfg = load_model_config(directory, base_model)
    logits, drift, vision = _device_figures(directory, cfg, precision, ref, settings)
    figures: dict[str, Any] = {
        "logits_pcc": pcc(ref.logits, logits),
        "top1_agreement": top1_agreement(logits, ref.continuation),
        "vision_pcc": vision,
        "expert_ade_drift_m": drift,
        "drive": None,
    }
    if ref.drive is not None:
        run = _drive_run(directory, base_model, precision, settings, ticks, label, progress)
        figures["drive"] = drive_figures(ref.drive, run)
    return figures


def _device_figures(
    directory: Path, cfg: ModelConfig, precision: Precision, ref: Reference, settings: Settings
) -> tuple[torch.Tensor, float | None, float | None]:
    """On one golden-mode device: the continuation's logits [n, V] of one device prefill of `ref.ids`, the
    expert's waypoint drift (None without an expert) and the vision tower's worst PCC (None without one)."""
    from alpamayo.tt.device import close_device, open_device
    from alpamayo.tt.expert import TTActionExpert
    from alpamayo.tt.text import TTTextModel
    from alpamayo.tt.vision import TTVisionEncoder

    device = open_device(0, mode="golden")
    try:
        with TTTextModel.from_checkpoint(directory, cfg, precision=precision, device=device) as text:
            expert = None
            if ref.expert is not None:  # before the cache: it reserves the expert's rows
                source = Checkpoint(directory, cfg.weight_prefix)
                expert_cfg = expert_config_of(cfg)
                if expert_cfg is None:
                    raise ValueError(
                        f"{directory}: the reference ran an action expert its config does not describe"
                    )
                expert = TTActionExpert.from_checkpoint(source, text, expert_cfg)
            text.setup_cache(ref.ids.numel())
            prompt = ref.ids.numel() - settings.tokens + 1
            logits = text.prefill_block(ref.ids[:prompt], drafted=ref.ids[prompt:])
            drift = None
            if expert is not None and ref.expert is not None:  # over the prompt rows, as `expert_run`
                actions = expert.sample(expert_noise(), ref.ids.numel(), text.rope_delta)
                drift = waypoint_drift(actions, ref.expert)
                expert.close()
            vision = None
            if ref.vision is not None:
                encoder = TTVisionEncoder.from_checkpoint(directory, cfg, precision=precision, device=device)
                vision = vision_pcc(ref.vision, encoder)
                encoder.close()
    finally:
        close_device(device)
    return logits, drift, vision


def _drive_run(
    directory: Path,
    base_model: str | None,
    precision: Precision,
    settings: Settings,
    ticks: Sequence[Any],
    label: str,
    progress: Progress,
) -> DriveRun:
    """The drive's ticks through the `--backend ttnn --tt-mode golden` runtime (trajectory tokens)."""
    from alpamayo.runtime import AlpamayoVLA

    spec = ModelSpec(
        checkpoint=str(directory),
        base_model=base_model,
        decoder="tokens",
        max_reasoning_tokens=settings.max_reasoning_tokens,
    )
    vla = AlpamayoVLA.from_spec(spec, options=BackendOptions("ttnn", recipe=precision, tt_mode="golden"))
    try:
        return drive_run(vla, ticks, label, progress)
    finally:
        vla.close()

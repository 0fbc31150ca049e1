"""How the action expert samples, as a run chooses it: Euler steps, the initial noise's temperature and the
navigation guidance weight (`FlowSettings`). The sampling itself is `alpamayo.expert.sampler`'s; these are
settings that the backends' contract, the commands and the node config carry, so they live with the config,
below the models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

from alpamayo.config.expert import ExpertConfig

# Navigation guidance at the checkpoint's own weight, `diffusion_cfg.inference_guidance_weight` (what NVIDIA's
# samplers use when no weight is passed, and the weight Alpamayo 2 Super's guided example passes).
CHECKPOINT_GUIDANCE = "checkpoint"


def parse_guidance(value: object, name: str = "navigation guidance weight") -> float | str:
    """A guidance weight as given (a number, numeric text, or `CHECKPOINT_GUIDANCE`); ValueError naming `name`
    for anything else."""
    if value == CHECKPOINT_GUIDANCE:
        return CHECKPOINT_GUIDANCE
    number = math.nan
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number or {CHECKPOINT_GUIDANCE!r}, got {value!r}")
    return number


def describe_guidance(guidance: float | str) -> str:
    """How a guidance setting reads in a message: the weight, or `checkpoint`."""
    return guidance if isinstance(guidance, str) else f"{guidance:g}"


@dataclass(frozen=True)
class FlowSettings:
    """steps: Euler steps (the config's `num_inference_steps` when None); temperature: scale of the initial
    noise (NVIDIA's default 1.0); guidance: navigation CFG weight w, or `CHECKPOINT_GUIDANCE` for the
    checkpoint's `inference_guidance_weight` (None: no CFG, one expert forward per step)."""

    steps: int | None = None
    temperature: float = 1.0
    guidance: float | str | None = None

    def __post_init__(self) -> None:
        if self.steps is not None and (not isinstance(self.steps, int) or self.steps < 1):
            raise ValueError(f"flow steps must be an integer >= 1, got {self.steps!r}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"flow temperature must be a finite number > 0, got {self.temperature!r}")
        if self.guidance is not None and parse_guidance(self.guidance) != self.guidance:
            raise ValueError(
                f"navigation guidance weight must be a finite number or {CHECKPOINT_GUIDANCE!r}, "
                f"got {self.guidance!r}"
            )

    def steps_for(self, cfg: ExpertConfig) -> int:
        """The Euler steps of a sampling with the expert of `cfg`: `steps`, else its `num_inference_steps`."""
        return self.steps or cfg.num_inference_steps

    def guidance_for(self, cfg: ExpertConfig) -> float | None:
        """The guidance weight of a sampling with the expert of `cfg` (None: no guidance)."""
        return (
            cfg.guidance_weight if self.guidance == CHECKPOINT_GUIDANCE else cast(float | None, self.guidance)
        )

    def record(self, cfg: ExpertConfig) -> dict[str, float | int | None]:
        """What a prediction records beside its trajectories (`Prediction.flow`) with the expert of `cfg`."""
        return {
            "steps": self.steps_for(cfg),
            "temperature": self.temperature,
            "guidance": self.guidance_for(cfg),
        }


DEFAULT_FLOW = FlowSettings()

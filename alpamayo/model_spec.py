"""`ModelSpec`: what to load and how to run it, in one validated value.

    spec = ModelSpec(checkpoint="demo/checkpoint-seed0", dtype="bfloat16", max_reasoning_tokens=8)
    vla = AlpamayoVLA.from_spec(spec)
    ModelSpec.from_dict(spec.to_dict()) == spec

The checkpoint (and the R1 / 1.5 base model), the backend options (`alpamayo.backends.BackendOptions`: torch
dtype and device, or the ttnn recipe, caches and mode; the torch backend's weight-only quantisation), the
trajectory decoder, the action expert's flow settings (`alpamayo.config.flow.FlowSettings`), the draft of the
reasoning, the sampling overrides of the model family's defaults, the reasoning cap and one-thread reproducible
compute. Its fields are its dict keys, the keys of the node YAML's `model:` section (`bridges.node.config`), of the
eval and closed-loop run records, and the command-line flags with dashes (`alpamayo.commands.common`). Every
value is checked on construction; an error names `model.KEY`, the value and the allowed range.

What one prediction asks for (the sample count, the seed, the route) is not the model's: the callers hold it.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alpamayo.backends import BACKENDS, BackendOptions, check_num_samples
from alpamayo.config.flow import CHECKPOINT_GUIDANCE, FlowSettings
from alpamayo.devices import DTYPES
from alpamayo.drafts import KINDS as DRAFTS
from alpamayo.expert.decoding import DECODERS
from alpamayo.generation import Sampling
from alpamayo.json_fields import build_dataclass, check
from alpamayo.plan.precision import PRESETS
from alpamayo.quant.recipe import DEFAULT_GROUP_SIZE, GROUP_SIZES, QUANT_MODES, QuantRecipe
from alpamayo.tt.device import MODES as TT_MODES  # mode names only: no ttnn import

KEY = "model."  # how every document that embeds a spec names its keys


@dataclass(frozen=True)
class ModelSpec:
    """What to load and how to run it. Paths are kept as text, as YAML and JSON spell them. None for
    temperature, top_p, top_k: the model family's default (`alpamayo.families`); for decoder: the expert
    whenever the checkpoint has its weights; for flow_steps: the checkpoint's Euler steps; for tt_mode:
    `ALPAMAYO_TT_MODE`, else device."""

    checkpoint: str | None = None
    base_model: str | None = None  # Alpamayo R1 / 1.5: base-model directory (alpamayo.families.base_model)
    backend: str = "torch"
    device: str = "cpu"  # torch backend
    dtype: str = "float32"  # torch backend
    recipe: str = "performance"  # ttnn backend: a precision preset or recipe YAML (alpamayo.plan.precision)
    tt_cache: str | None = None  # ttnn backend: directory of the packed weight cache (.tensorbin files)
    tt_mode: str | None = None  # ttnn backend: device | golden (host, no card)
    moe_config: str | None = None  # ttnn backend, MoE checkpoints: block config YAML (None: the shipped one)
    quant: str = "none"  # torch backend: weight-only none / int8 / int4 (alpamayo.quant); ttnn uses recipe
    quant_group: int = DEFAULT_GROUP_SIZE  # quant int4: input columns per scale and zero (32, 64, 128)
    quant_head: bool = False  # quant: the LM head too
    quant_cache: str | None = None  # quant: directory of the packed-weight cache (alpamayo.quant.cache)
    # Trajectory decoder: "expert" (flow-matching action expert) or "tokens"; the expert's Euler steps, noise
    # temperature and navigation guidance weight (None: no CFG; "checkpoint": the checkpoint's
    # inference_guidance_weight; a prediction with guidance needs a route).
    decoder: str | None = None
    flow_steps: int | None = None
    flow_temperature: float = 1.0
    nav_guidance: float | str | None = None
    draft: str = (
        "none"  # speculative draft of the reasoning (alpamayo.drafts): none, lookup, previous, dflash:DIR
    )
    # Decoding; temperature 0 = greedy.
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_reasoning_tokens: int = 256  # after this many, <|traj_future_start|> is forced
    # one torch and one BLAS thread: the same bytes on any thread count (alpamayo.reproducibility.mode)
    reproducible: bool = False

    def __post_init__(self) -> None:
        for name in ("checkpoint", "base_model", "tt_cache", "moe_config", "quant_cache"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))
        if isinstance(self.nav_guidance, int) and not isinstance(self.nav_guidance, bool):
            object.__setattr__(self, "nav_guidance", float(self.nav_guidance))
        self._check()

    def _check(self) -> None:
        """ConfigError naming `model.KEY`, the value and the allowed range of the first bad value; then the
        typed parts are built (their own checks name the setting too)."""
        check(
            self.draft in DRAFTS[:3]
            or (self.draft.startswith("dflash:") and Path(self.draft[len("dflash:") :]).is_dir()),
            KEY + "draft",
            self.draft,
            "none, lookup, previous or dflash:DIR with an existing DIR",
        )
        check(self.backend in BACKENDS, KEY + "backend", self.backend, ", ".join(BACKENDS))
        check(self.dtype in DTYPES, KEY + "dtype", self.dtype, ", ".join(DTYPES))
        check(
            self.tt_mode in (None, *TT_MODES), KEY + "tt_mode", self.tt_mode, ", ".join(["null", *TT_MODES])
        )
        check(
            self.recipe in PRESETS or Path(self.recipe).is_file(),
            KEY + "recipe",
            self.recipe,
            f"{', '.join(PRESETS)} or an existing recipe YAML file",
        )
        check(self.quant in QUANT_MODES, KEY + "quant", self.quant, ", ".join(QUANT_MODES))
        check(
            self.quant_group in GROUP_SIZES,
            KEY + "quant_group",
            self.quant_group,
            ", ".join(map(str, GROUP_SIZES)),
        )
        check(
            self.backend == "torch" or self.quant == "none",
            KEY + "quant",
            self.quant,
            f"none with backend ttnn (choose its precision with {KEY}recipe)",
        )
        check(
            self.temperature is None or 0 <= self.temperature <= 10,
            KEY + "temperature",
            self.temperature,
            "0 (greedy) .. 10, or null for the model family's default",
        )
        check(self.top_p is None or 0 < self.top_p <= 1, KEY + "top_p", self.top_p, "(0, 1] or null")
        check(
            self.top_k is None or self.top_k >= 1, KEY + "top_k", self.top_k, ">= 1, or null for all tokens"
        )
        check(
            self.decoder in (None, *DECODERS),
            KEY + "decoder",
            self.decoder,
            ", ".join([*DECODERS, "null"]),
        )
        check(
            self.nav_guidance in (None, CHECKPOINT_GUIDANCE)
            or (isinstance(self.nav_guidance, float) and math.isfinite(self.nav_guidance)),
            KEY + "nav_guidance",
            self.nav_guidance,
            f"a finite number, {CHECKPOINT_GUIDANCE!r} (the checkpoint's weight) or null",
        )
        flow = self.flow  # FlowSettings: flow steps >= 1, flow temperature > 0
        check(
            flow.steps is None or flow.steps <= 1000,
            KEY + "flow_steps",
            flow.steps,
            "1..1000, or null for the checkpoint's",
        )
        check(flow.temperature <= 10, KEY + "flow_temperature", flow.temperature, "(0, 10]")
        check(
            isinstance(self.max_reasoning_tokens, int) and 1 <= self.max_reasoning_tokens <= 4096,
            KEY + "max_reasoning_tokens",
            self.max_reasoning_tokens,
            "1..4096",
        )
        self.options  # noqa: B018  (BackendOptions' own checks: the ttnn mode)

    @property
    def options(self) -> BackendOptions:
        """How the backend loads the weights."""
        return BackendOptions(
            self.backend,
            self.dtype,
            self.device,
            self.recipe,
            self.tt_cache,
            self.moe_config,
            self.quant_recipe,
            self.quant_cache,
            self.tt_mode,
        )

    @property
    def quant_recipe(self) -> QuantRecipe:
        return QuantRecipe(self.quant, self.quant_group, self.quant_head)

    @property
    def flow(self) -> FlowSettings:
        """The action expert's Euler steps, noise temperature and navigation guidance."""
        return FlowSettings(self.flow_steps, self.flow_temperature, self.nav_guidance)

    def sampling(self, default: Sampling) -> Sampling:
        """`default` (the model family's) with this spec's temperature, top_p and top_k where given."""
        return default.override(self.temperature, self.top_p, self.top_k)

    def check_samples(self, num_samples: int) -> None:
        """ValueError, before any load, for `num_samples` trajectory samples this spec cannot draw
        (`alpamayo.backends.check_num_samples`: greedy decoding, the device's limits)."""
        check_num_samples(self.backend, num_samples, self.temperature, self.checkpoint, self.base_model)

    def to_dict(self) -> dict[str, Any]:
        """The spec as YAML and JSON spell it: {key: value} over every field (`from_dict` reads it back)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(ModelSpec)}

    @classmethod
    def from_dict(cls, data: Any, path: str = KEY) -> ModelSpec:
        """The spec of a mapping of its keys (absent ones take their defaults); ConfigError for an unknown key,
        a value of the wrong type or out of range, naming `path` + key."""
        return build_dataclass(cls, data, path)

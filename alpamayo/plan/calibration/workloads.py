"""An anchor's workload rebuilt with the roofline's own stage builders (`alpamayo.plan.estimate`), so the model
is fitted on exactly the ops, layers and host traffic that `alpamayo plan` prices.

`stages(workload)` -> [(sign, StageEstimate), ...]: the passes whose expected times, summed with their
signs, model the measured figure (one pass for most stages; a `prefill_delta` is a prefill minus another).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any

from alpamayo.config.builtin import EXPERT_NAMES, NAMES, builtin_config, builtin_expert
from alpamayo.config.expert import ExpertConfig
from alpamayo.config.model import ModelConfig
from alpamayo.errors import ConfigError
from alpamayo.plan.estimate import (
    StageEstimate,
    decode_attention_ops,
    decode_estimate,
    expert_estimate,
    logits_bytes,
    prefill_estimate,
    vision_estimate,
)
from alpamayo.plan.precision import load_precision
from alpamayo.plan.programs.text import plan_text

# the action expert's KV cache positions of the anchors' runs (the plan's default)
EXPERT_MAX_SEQ_LEN = 8192


@cache
def _named(name: str) -> tuple[ModelConfig, ExpertConfig | None]:
    if name in NAMES:
        return builtin_config(name), None
    if name in EXPERT_NAMES:
        return builtin_expert(name)
    raise ConfigError(f"workload model {name!r}: not a built-in config ({', '.join(NAMES + EXPERT_NAMES)})")


def model_of(w: dict[str, Any]) -> tuple[ModelConfig, ExpertConfig | None]:
    """The workload's model: a built-in by `model`, or `base` with its text `dims` replaced (a published
    model of another family at its dimensions, e.g. Llama-3.1-8B on Qwen3-VL-8B's layout); `layers` cuts
    the text decoder (and the action expert, which reads every VLM layer's cache) to that many layers,
    `vision_layers` the vision tower to that many blocks."""
    if "dims" in w:
        if "base" not in w:
            raise ConfigError(f"workload {w['model']!r}: dims need a base config to replace them in")
        cfg, expert = _named(w["base"])
        try:
            cfg = replace(cfg, text=replace(cfg.text, **w["dims"]))
        except TypeError as e:
            raise ConfigError(f"workload {w['model']!r}: bad dims {w['dims']}: {e}") from None
    else:
        cfg, expert = _named(w["model"])
    if "layers" in w:
        n = w["layers"]
        # the raw text config too: a release's action expert is read from it and mirrors the VLM's layers
        raw = {**(cfg.raw_text_config or {}), "num_hidden_layers": n}
        cfg = replace(cfg, text=replace(cfg.text, num_hidden_layers=n), raw_text_config=raw)
        if expert is not None:
            expert = replace(expert, text=replace(expert.text, num_hidden_layers=n))
    if "vision_layers" in w and cfg.vision is not None:  # the DeepStack levels move to the last blocks
        v, n = cfg.vision, w["vision_layers"]
        levels = len(v.deepstack_visual_indexes)
        deepstack = tuple(sorted({max(0, n - levels + i) for i in range(levels)}))
        cfg = replace(cfg, vision=replace(v, depth=n, deepstack_visual_indexes=deepstack))
    return cfg, expert


def _without_logits(stage: StageEstimate, w: dict[str, Any]) -> StageEstimate:
    """A program that picked the token on the device (`logits_to_host: false`) reads back one id, not rows."""
    return stage if w.get("logits_to_host", True) else replace(stage, host_bytes=4.0)


def _pass(stage: StageEstimate, ops: list | tuple | None = None, **kw: Any) -> StageEstimate:
    """`stage` as one pass (repeat 1), with `ops` and fields replaced where given."""
    return replace(stage, ops=tuple(stage.ops if ops is None else ops), repeat=1, **kw)


def _decode(cfg: ModelConfig, w: dict[str, Any]) -> StageEstimate:
    """One decode step of `batch` users, each over its own `context` positions: the weights read once for
    the batch (rows of one tile), each user's K/V read and attended by the flash-decode."""
    precision = load_precision(w["recipe"])
    batch = w.get("batch", 1)
    step = decode_estimate(cfg, precision, w["context"], 1)
    ops = [
        replace(op, flops=op.flops * batch, dram_bytes=op.dram_bytes * batch) if ".sdpa." in op.name else op
        for op in step.ops
    ]
    host = logits_bytes(cfg.text, batch)
    return _without_logits(_pass(step, ops, host_bytes=host, traced=w.get("traced", True)), w)


def stages(w: dict[str, Any]) -> list[tuple[int, StageEstimate]]:
    """The signed passes that model workload `w` (see the module docstring)."""
    cfg, expert = model_of(w)
    precision = load_precision(w["recipe"])
    kind = w["stage"]
    if kind == "decode_step":
        return [(1, _decode(cfg, w))]
    if kind in ("decode_op", "lm_head_op"):
        name = "lm_head" if kind == "lm_head_op" else f"layers.0.{w['op']}"
        step = decode_estimate(cfg, precision, w.get("context", 1), 1)
        ops = [op for op in step.ops if op.name == name]
        if not ops:
            raise ConfigError(f"workload {w['model']}: no decode op {name!r}")
        return [(1, _pass(step, ops, layers=0.0, host_bytes=0.0))]
    if kind == "sdpa_decode_op":
        one = replace(cfg.text, num_hidden_layers=1)
        cores = plan_text(cfg, precision).sdpa_decode_grid.cores
        (op,) = decode_attention_ops(one, w["context"], precision, cores, "decode.sdpa")
        batch = w.get("batch", 1)
        op = replace(op, flops=op.flops * batch, dram_bytes=op.dram_bytes * batch)
        return [(1, StageEstimate("flash-decode", (op,)))]
    if kind in ("prefill", "prefill_delta"):
        first = _without_logits(_pass(prefill_estimate(cfg, precision, w["prompt"])), w)
        if kind == "prefill":
            return [(1, first)]
        minus = _without_logits(_pass(prefill_estimate(cfg, precision, w["minus_prompt"])), w)
        return [(1, first), (-1, minus)]
    if kind == "vision_frame":
        h, wd = (int(x) for x in w["image_size"].split("x"))
        return [(1, _pass(vision_estimate(cfg, precision, 1, (h, wd))))]
    if kind == "expert_step":
        if expert is None:
            raise ConfigError(f"workload {w['model']}: an expert_step needs a release with an action expert")
        step = expert_estimate(
            cfg, expert, precision, EXPERT_MAX_SEQ_LEN, w.get("samples", 1), w["prompt"] + w["context"]
        )
        return [(1, _pass(step))]
    if kind == "host_read":
        return [(1, StageEstimate("host read", (), 1, 0.0, host_bytes=float(w["bytes"])))]
    raise ConfigError(f"workload stage {kind!r} has no model")

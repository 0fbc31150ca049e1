"""The attributes `TTTextModel` holds that both its prefill and its decode half read (declarations only: the
model sets them in `alpamayo.tt.text.model`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from alpamayo.config.model import TextConfig
from alpamayo.plan.programs.text import TextPlan
from alpamayo.profiling import Tracer
from alpamayo.text.rope import MRope
from alpamayo.tt.device_io import DeviceIO
from alpamayo.tt.moe import TTMoE


class TextState(DeviceIO):
    """Shared state of the text model's mixins: config, program plan, tracer, rotary tables, compute kernel
    configs (`ck`), device weights (global and per layer), MoE blocks by layer index, attention scale, padded
    hidden width, residual-norm eps, and the KV cache with its filled length, rope offset and capacity."""

    text_cfg: TextConfig
    plan: TextPlan
    tracer: Tracer
    rope: MRope
    ck: dict[str, Any]
    weights: dict[str, Any]
    layer_weights: list[dict[str, Any]]
    moe: dict[int, TTMoE]
    scale: float
    hidden_padded: int
    residual_eps: float
    cache_len: int
    rope_delta: int
    _require_cache: Callable[[], None]

    if TYPE_CHECKING:  # read-only properties of the model

        @property
        def max_seq_len(self) -> int: ...

        @property
        def kv_cache(self) -> list[tuple[Any, Any]]: ...

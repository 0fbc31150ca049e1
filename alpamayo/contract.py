"""The backend contract: what the runtime asks of a text backbone, a vision tower and a trajectory decoder.

Both backends satisfy these `Protocol`s structurally, without importing them: the torch reference
(`alpamayo.text.TextModel`, `vision.encoder.VisionEncoder`, `alpamayo.expert.decoding.ExpertDecoder`) and ttnn
(`alpamayo.tt.text.TTTextModel`, `alpamayo.tt.vision.TTVisionEncoder`, `alpamayo.tt.expert.TTExpertDecoder`).
`alpamayo.backends`' loaders return each implementation as its protocol, so the type check (mypy, run by
`tests/test_types.py`) fails when either backend drifts from the contract.

A capability that only one backend has is declared, not probed: the runtime reads the declaration before it
calls (`TrajectoryDecoder.unguided`: None where the decoder cannot build navigation guidance's unguided branch).

Tensor contract (both backends): token ids int64; logits float32; hidden states and features in the model's
dtype (torch) or bf16 (ttnn); the KV cache's rows are sequences, each with its own filled length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from alpamayo.config.flow import FlowSettings
from alpamayo.config.model import ModelConfig
from alpamayo.generation import ForkableLM
from alpamayo.prediction import Cancellation
from alpamayo.profiling.tracer import Tracer
from planner.plans import GeneratedPlan


@dataclass(frozen=True)
class ImageFeatures:
    """What the language model needs from one image: embeds [n, H] and DeepStack features (one [n, H] per
    level), n = t * h * w / merge^2 tokens for the patch grid `grid_thw` (t, h, w), in the model dtype."""

    embeds: torch.Tensor
    deepstack: tuple[torch.Tensor, ...]
    grid_thw: tuple[int, ...]


class CacheShape(Protocol):
    """The capacity of a backbone's static KV cache."""

    @property
    def max_seq_len(self) -> int:
        """Positions per row (prompt + generated)."""
        ...

    @property
    def max_batch(self) -> int:
        """Rows (sequences)."""
        ...


class TextBackbone(Protocol):
    """The Qwen3-VL text decoder with its static KV cache and generation state.

    Rows: `fork(n)` continues a prefilled prompt as n rows sharing its cache; row i holds `lengths[i]`
    positions and appends at that cache index, rope position `lengths[i] + rope_delta`. `verify` appends and
    scores a block of T tokens per row (a speculative block, or a known continuation: the backbone's
    extend), `rollback` keeps each row's accepted prefix. `captured`: the layer outputs [L, H] a prefill with
    `capture` left (a DFlash draft's context; read-only: the ttnn backbone downloads them when read)."""

    cfg: ModelConfig
    lengths: list[int]
    rope_delta: int

    @property
    def captured(self) -> list[torch.Tensor]:
        """The layer outputs [L, H] the last prefill with `capture` left, on the host."""

    @property
    def cache(self) -> CacheShape | None:
        """The active KV cache (None before `setup_cache`)."""
        ...

    @property
    def cache_len(self) -> int:
        """The longest active row's length."""
        ...

    @property
    def batch(self) -> int:
        """Active rows."""
        ...

    @property
    def max_verify_rows(self) -> int | None:
        """Rows x tokens one `verify` takes (None: no bound; ttnn: one tile)."""
        ...

    def setup_cache(self, max_seq_len: int, max_batch: int = 1) -> None:
        """Allocate the cache: `max_batch` rows of `max_seq_len` positions; forgets the prompt."""
        ...

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [...] -> embeddings [..., H]."""
        ...

    def prefill_hidden(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        visual_pos_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture: Sequence[int] = (),
    ) -> torch.Tensor:
        """A fresh prompt (ids [L] or embeddings [L, H]; M-RoPE ids [3, L]; image-row mask [L]; DeepStack
        levels [n_visual, H]) into row 0 of the cache -> final-normed hidden [L, H]."""
        ...

    def prefill(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        visual_pos_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture: Sequence[int] = (),
    ) -> torch.Tensor:
        """`prefill_hidden`, then float32 logits [V] of the last prompt position."""
        ...

    def prefill_block(
        self,
        inputs: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        visual_pos_mask: torch.Tensor | None = None,
        deepstack: Sequence[torch.Tensor] | None = None,
        capture: Sequence[int] = (),
        drafted: torch.Tensor | Sequence[int] = (),
    ) -> torch.Tensor:
        """A prompt (as `prefill`) and the token ids `drafted` [n] after it, at the positions decode steps
        would give them -> float32 logits [n + 1, V] of the prompt's last position and each drafted one (a
        first speculative block verified with the prefill); the cache holds the prompt and the n."""
        ...

    def fork(self, n: int) -> None:
        """Continue the prefilled prompt as n rows sharing its KV cache."""
        ...

    def decode(self, tokens: int | torch.Tensor) -> torch.Tensor:
        """Append one token per active row -> float32 logits ([V] for an int, [B, V] for ids [B])."""
        ...

    def verify(
        self, tokens: torch.Tensor, capture: Sequence[int] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Append ids [B, T] (row i's at cache indices lengths[i] ..) in one forward -> float32 logits
        [B, T, V]; with `capture` also the layers' outputs [B, T, len(capture) * H]."""
        ...

    def rollback(self, lengths: Sequence[int]) -> None:
        """Keep each active row's first lengths[i] positions."""
        ...

    def trace_into(self, tracer: Tracer) -> None:
        """Record the backbone's own stages (device work, host <-> device copies) as spans in `tracer`."""
        ...

    def close(self) -> None:
        """Release what the backbone holds on its device."""
        ...


class SpeculativeLM(ForkableLM, Protocol):
    """What speculative decoding asks of a backbone (`alpamayo.decoding.speculative`; every `TextBackbone` is
    one): a `ForkableLM` that verifies blocks: `verify(ids [B, T], capture) -> logits [B, T, V]` (and the
    captured layer outputs), `rollback(lengths)`, per-row `lengths` and `max_verify_rows`, the most B x T one
    verify runs (None: no bound; ttnn: 32, one tile) (`alpamayo.text.model.TextModel`)."""

    lengths: list[int]
    max_verify_rows: int | None

    def verify(
        self, tokens: torch.Tensor, capture: Sequence[int] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...

    def rollback(self, lengths: Sequence[int]) -> None: ...


class VisionTower(Protocol):
    """The Qwen3-VL vision encoder."""

    def encode(
        self, pixel_values: torch.Tensor, grid_thw: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """pixel_values [N, patch_dim], grid_thw [n, 3] -> (image embeds [N/4, out_hidden], DeepStack features:
        one [N/4, out_hidden] per level)."""
        ...

    def trace_into(self, tracer: Tracer) -> None:
        """Record the tower's own stages as spans in `tracer`."""
        ...

    def close(self) -> None:
        """Release what the tower holds on its device."""
        ...


class PromptModel(Protocol):
    """What the unguided branch of navigation guidance needs of a VLM: its backbone, and the prefill of a
    prompt with its images' features (`alpamayo.vlm.VisionLanguageModel`)."""

    @property
    def text(self) -> TextBackbone: ...

    def prefill_hidden(
        self, input_ids: torch.Tensor | Sequence[int], features: Sequence[ImageFeatures]
    ) -> torch.Tensor: ...


class DecoderContext(Protocol):
    """Where one sampling of a trajectory decoder reads the backbone's cache; opaque to the runtime."""

    @property
    def rows(self) -> int:
        """Samples (K)."""
        ...


# vlm, the unguided prompt's expanded ids, its images' features, the plans, <|traj_future_start|>, the filler
UnguidedContext = Callable[
    [PromptModel, Sequence[int], Sequence[ImageFeatures], Sequence[GeneratedPlan], int, int], DecoderContext
]


class TrajectoryDecoder(Protocol):
    """The flow-matching action expert after the reasoning: K normalised action sequences [K, n_tokens, 2]
    from the backbone's cache (`alpamayo.expert.decoding`). The other trajectory decoder, the 128
    trajectory tokens, is the backbone's own decoding (`alpamayo.decoding.loop.generate_plans`)."""

    settings: FlowSettings

    @property
    def n_tokens(self) -> int:
        """Action tokens (waypoints) per sample."""
        ...

    @property
    def steps(self) -> int:
        """Euler steps per sampling."""
        ...

    @property
    def unguided(self) -> UnguidedContext | None:
        """The declared guidance capability: what builds the unguided branch's context (the prompt without
        its route, in a cache of its own), or None where this decoder cannot run navigation guidance."""
        ...

    def record(self) -> dict[str, float | int | None]:
        """The settings a prediction records beside its trajectories (`Prediction.flow`)."""
        ...

    def context(self, text: TextBackbone, prompt_len: int, plans: Sequence[GeneratedPlan]) -> DecoderContext:
        """The guided context: `text`'s cache rows 0..K-1 after `generate_plans(trajectory_tokens=False)`."""
        ...

    def sample(
        self,
        ctx: DecoderContext,
        seed: int | None = None,
        noise: torch.Tensor | None = None,
        unguided: DecoderContext | None = None,
        tracer: Tracer | None = None,
        cancel: Cancellation | None = None,
    ) -> torch.Tensor:
        """[K, n_tokens, 2] float32 normalised actions, K = ctx.rows, from `noise` or seeded noise; `cancel`
        is checked before each Euler step (`alpamayo.prediction.PredictionCancelled`)."""
        ...

    def close(self) -> None:
        """Release what the decoder holds on its device."""
        ...

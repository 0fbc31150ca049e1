"""The action expert as the trajectory decoder of one prediction, after the VLM's reasoning.

    plans = generate_plans(vlm, logits, vocab, sampler, limits, eos, trajectory_tokens=False)
    actions = decoder.sample(vlm.text, plans, prompt_len, seed)            # [K, 64, 2] normalised
    # with navigation guidance: the unguided branch's context first
    unguided = decoder.unguided_context(vlm, unguided_ids, features, plans, ...)

Row i's `<|traj_future_start|>` is at cache position prompt_len + len(reasoning_i) (`generate_plans`), so its
offset is one more. The unguided branch is NVIDIA's: the prompt without the route (1.5,
`sample_trajectories_from_data_with_vlm_rollout_cfg_nav`: the guided ids without their
`<|route_start|>..<|route_end|>` span, `unguided_prompt`; 2 Super, `examples/two_gpu_nav_cfg_demo.py`: the
prompt rendered again without its raw route text) is prefilled once into its own cache with the same images,
forked into K rows, and every generated token of each row is replayed into it in one forward, including the one
NVIDIA's generation produces after the last `<|traj_future_start|>` (its padding; here: the filler), which the
expert's mask hides with the rest after the offset. Its action positions follow from its own, shorter prompt.
The velocities mix as (1 - w) v_unguided + w v_guided at each Euler step (`alpamayo.expert.sampler`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from alpamayo.config.expert import ExpertConfig
from alpamayo.config.flow import DEFAULT_FLOW, FlowSettings
from alpamayo.contract import DecoderContext, ImageFeatures, PromptModel, TextBackbone, UnguidedContext
from alpamayo.expert.model import ActionExpert, ExpertContext
from alpamayo.expert.sampler import euler_sample, noise_for
from alpamayo.prediction import Cancellation
from alpamayo.profiling.tracer import Tracer
from alpamayo.text.kv_cache import KVCache
from alpamayo.text.model import TextModel
from planner.plans import GeneratedPlan


def offsets_after_reasoning(prompt_len: int, plans: Sequence[GeneratedPlan]) -> list[int]:
    """Per row, the cache index of its `<|traj_future_start|>` plus 1."""
    return [prompt_len + len(p.reasoning_token_ids) + 1 for p in plans]


def replayed_tokens(plans: Sequence[GeneratedPlan], start_id: int, filler_id: int) -> torch.Tensor:
    """[K, n + 1] int64: what each row fed after the prompt (reasoning, `<|traj_future_start|>` = `start_id`,
    `filler_id` up to the longest row's n tokens), plus the one token NVIDIA's generation produces after the
    last start."""
    n = max(len(p.reasoning_token_ids) for p in plans) + 1
    rows = [
        p.reasoning_token_ids + [start_id] + [filler_id] * (n - len(p.reasoning_token_ids)) for p in plans
    ]
    return torch.tensor(rows, dtype=torch.long)


def unguided_prompt(ids: Sequence[int], route_start: int, route_end: int) -> list[int]:
    """The prompt without its navigation span, `route_start` through `route_end` inclusive (NVIDIA's
    `remove_nav_text`, on token ids)."""
    ids = list(ids)
    if route_start not in ids or route_end not in ids or ids.index(route_end) < ids.index(route_start):
        raise ValueError(
            "navigation guidance needs a route in the prompt (<|route_start|> ... <|route_end|>): the unguided "
            "branch is the same prompt without it"
        )
    return ids[: ids.index(route_start)] + ids[ids.index(route_end) + 1 :]


class ExpertDecoder:
    """Samples K normalised action sequences with `expert`, reading a torch text model's cache in place (the
    torch `alpamayo.contract.TrajectoryDecoder`)."""

    def __init__(self, expert: ActionExpert, settings: FlowSettings = DEFAULT_FLOW, cuda_graph: bool = False):
        """`cuda_graph`: on a CUDA expert, capture each sampling's step once and replay it per Euler step
        (`alpamayo.expert.cuda_graph`); eager otherwise."""
        self.check_settings(expert.cfg, settings)
        self.expert, self.settings, self.cuda_graph = expert, settings, cuda_graph
        self._unguided_cache: KVCache | None = None

    @staticmethod
    def check_settings(cfg: ExpertConfig, settings: FlowSettings) -> None:
        """ValueError for settings this checkpoint's expert cannot run (before any weight is loaded): Super's
        guidance at another noise temperature than NVIDIA's guided example samples (`guided_temperature`)."""
        fixed = cfg.guided_temperature
        if settings.guidance is not None and fixed is not None and settings.temperature != fixed:
            raise ValueError(
                f"--flow-temperature {settings.temperature:g} with --nav-guidance: this checkpoint's navigation "
                f"guidance draws its noise at temperature {fixed:g} (Alpamayo 2 Super, as NVIDIA's "
                "two_gpu_nav_cfg_demo samples it); drop --flow-temperature"
            )

    @property
    def steps(self) -> int:
        return self.settings.steps_for(self.expert.cfg)

    @property
    def n_tokens(self) -> int:
        """Action tokens per sample (the action space's waypoints)."""
        return self.expert.n_tokens

    @property
    def unguided(self) -> UnguidedContext:
        """Navigation guidance's unguided branch: `unguided_context`."""
        return self.unguided_context

    def record(self) -> dict[str, float | int | None]:
        """The settings a prediction records beside its trajectories (`Prediction.flow`)."""
        return self.settings.record(self.expert.cfg)

    def context(self, text: TextBackbone, prompt_len: int, plans: Sequence[GeneratedPlan]) -> ExpertContext:
        """The guided context: `text`'s cache rows 0..K-1 after `generate_plans(trajectory_tokens=False)`."""
        return self.expert.context(
            _torch_cache(text), offsets_after_reasoning(prompt_len, plans), text.rope_delta, text.cache_len
        )

    def unguided_context(
        self,
        vlm: PromptModel,
        ids: Sequence[int],
        features: Sequence[ImageFeatures],
        plans: Sequence[GeneratedPlan],
        start_id: int,
        filler_id: int,
    ) -> ExpertContext:
        """Prefill the unguided prompt `ids` (expanded, with the same image `features`) into a cache of its own,
        replay each row's generated tokens (`replayed_tokens`) into it, and view it; the VLM's own cache and
        state are restored."""
        text = vlm.text
        if not isinstance(text, TextModel):
            raise TypeError(
                f"the torch action expert's unguided branch runs on a torch TextModel, got {text!r}"
            )
        replay = replayed_tokens(plans, start_id, filler_id)
        rows, need = replay.shape[0], len(ids) + replay.shape[1]
        cache = self._unguided_cache
        if cache is None or cache.max_batch < rows or cache.max_seq_len < need:
            cache = self._unguided_cache = text.new_cache(need, rows)
        saved = text.save_state()
        try:
            text.cache = cache
            vlm.prefill_hidden(ids, features)
            text.fork(rows)
            text.extend(replay)
            return self.context(text, len(ids), plans)
        finally:
            text.restore_state(saved)

    def sample(
        self,
        ctx: DecoderContext,
        seed: int | None = None,
        noise: torch.Tensor | None = None,
        unguided: DecoderContext | None = None,
        tracer: Tracer | None = None,
        cancel: Cancellation | None = None,
    ) -> torch.Tensor:
        """[K, 64, 2] float32 normalised actions, K = ctx.rows: Euler steps from `noise` (or seeded noise).
        `ctx` and `unguided`: this decoder's `context` / `unguided_context`."""
        weight = self.settings.guidance_for(self.expert.cfg)
        if (unguided is None) != (weight is None):
            raise ValueError("navigation guidance needs both the guidance weight and the unguided context")
        x0 = noise_for(ctx.rows, self.expert.n_tokens, self.settings, seed, noise)
        return euler_sample(
            x0,
            self.steps,
            self.step(_own(ctx)),
            None if unguided is None else self.step(_own(unguided)),
            1.0 if weight is None else weight,
            tracer,
            cancel,
        )

    def step(self, ctx: ExpertContext) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The velocity of one context: a captured CUDA graph with `cuda_graph` on a CUDA expert, else eager."""
        expert = self.expert
        if self.cuda_graph and expert.device.type == "cuda":
            from alpamayo.expert.cuda_graph import GraphedVelocity

            return GraphedVelocity(expert, ctx)
        return lambda x, t: expert.velocity(x, t, ctx)

    def close(self) -> None:
        """The torch expert holds nothing but host or CUDA tensors: nothing to release."""


def _torch_cache(text: TextBackbone) -> KVCache:
    """The torch KV cache `text` reads and writes; TypeError for another backend's backbone."""
    if not isinstance(text.cache, KVCache):
        raise TypeError(f"the torch action expert reads a torch TextModel's KV cache, got {text.cache!r}")
    return text.cache


def _own(ctx: DecoderContext) -> ExpertContext:
    """`ctx` as the torch expert's context; TypeError for another decoder's."""
    if not isinstance(ctx, ExpertContext):
        raise TypeError(f"the torch action expert samples its own ExpertContext, got {type(ctx).__name__}")
    return ctx


DECODERS = ("expert", "tokens")


def choose_decoder(
    requested: str | None, expert_cfg: ExpertConfig | None, has_weights: bool, source: str
) -> str:
    """The trajectory decoder of a run: `requested` ("expert" or "tokens"), or None for the default, the expert
    whenever the checkpoint has expert weights (on either backend: ttnn runs it on the device beside the VLM,
    `alpamayo.tt.expert`). ValueError naming what is missing when the expert is asked for and cannot run."""
    if requested is not None and requested not in DECODERS:
        raise ValueError(f"decoder must be one of {list(DECODERS)}, got {requested!r}")
    available = expert_cfg is not None and has_weights
    if requested is None:
        return "expert" if available else "tokens"
    if requested == "expert" and not available:
        why = (
            "its config.json describes no action expert (no expert_cfg / action_in_proj_cfg / expert_config)"
            if expert_cfg is None
            else "it holds no expert tensors"
        )
        raise ValueError(f"--decoder expert: {source}: {why}; use --decoder tokens")
    return requested

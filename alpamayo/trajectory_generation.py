"""Reasoning-then-trajectory generation over a prefilled model (Alpamayo's discrete trajectory path).

After the prompt (which ends with `<|cot_start|>`), each of the K samples:
  1. reasons: tokens are sampled with every trajectory token `<iN>` and the EOS ids masked out, until the model
     emits `<|traj_future_start|>`; once `max_reasoning_tokens` have been generated it is forced;
  2. writes its trajectory: exactly `tokens_per_future` (128) tokens, each restricted to the future-trajectory
     vocabulary `<i0>`..`<i{F-1}>`.
The K samples share one prefill: the model forks its prompt KV cache into K rows and all rows decode in lock
step; a row that has finished is fed `<|traj_future_end|>` until the others finish (its output is ignored).
Works on any `ForkableLM` (the text model or the VLM).

With `trajectory_tokens=False` (the flow-matching action expert decodes the trajectory instead, as NVIDIA's
release does) step 2 is skipped: generation stops once every row's `<|traj_future_start|>` is in the KV cache
(NVIDIA's `StopAfterEOS`: one decode after the last row emits it). Row i's `<|traj_future_start|>` then sits at
cache position prompt_len + len(reasoning_i); the filler after it is what `alpamayo.expert` masks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from alpamayo.generation import ForkableLM, TokenSampler
from alpamayo.profiling.tracer import Tracer
from planner.tokenizers import TrajectoryVocab

REASONING, TRAJECTORY, DONE = 0, 1, 2
FILLER = "traj_future_end"  # the marker fed to rows that have finished while others continue


@dataclass(frozen=True)
class PlanLimits:
    """max_reasoning_tokens: cap before `<|traj_future_start|>` is forced (Alpamayo's test script uses 256);
    tokens_per_future: trajectory tokens per sample (2 per waypoint)."""

    max_reasoning_tokens: int = 256
    tokens_per_future: int = 128

    def __post_init__(self) -> None:
        if self.max_reasoning_tokens < 0 or self.tokens_per_future < 1:
            raise ValueError(
                f"max_reasoning_tokens must be >= 0 and tokens_per_future >= 1, got "
                f"{self.max_reasoning_tokens} and {self.tokens_per_future}"
            )

    @property
    def decode_positions(self) -> int:
        """KV-cache positions the generation appends after the prompt (every generated token but the last)."""
        return self.max_reasoning_tokens + self.tokens_per_future


@dataclass
class GeneratedPlan:
    """One sample: reasoning token ids (without `<|traj_future_start|>`), whether the cap forced the end of the
    reasoning, and the trajectory as future bins [tokens_per_future] and their token ids."""

    reasoning_token_ids: list[int]
    reasoning_capped: bool
    future_bins: np.ndarray
    future_token_ids: list[int]


class _Masks:
    """Additive logit biases [V] of the two phases: reasoning (trajectory tokens and `blocked_ids` at
    -inf) and trajectory (everything but the future-trajectory tokens at -inf)."""

    def __init__(
        self, vocab: TrajectoryVocab, vocab_size: int, blocked_ids: Sequence[int], device: torch.device
    ):
        future = torch.as_tensor(vocab.future_ids, device=device)
        traj = torch.cat([future, torch.as_tensor(vocab.history_ids, device=device)])
        self.reasoning = torch.zeros(vocab_size, device=device)
        self.reasoning[traj] = float("-inf")
        self.reasoning[torch.as_tensor(list(blocked_ids), dtype=torch.long, device=device)] = float("-inf")
        self.trajectory = torch.full((vocab_size,), float("-inf"), device=device)
        self.trajectory[future] = 0.0


def generate_plans(
    model: ForkableLM,
    first_logits: torch.Tensor,
    vocab: TrajectoryVocab,
    sampler: TokenSampler,
    limits: PlanLimits = PlanLimits(),
    eos_ids: Sequence[int] = (),
    tracer: Tracer | None = None,
    trajectory_tokens: bool = True,
) -> list[GeneratedPlan]:
    """K = len(sampler.generators) samples after a prefill whose last-position logits are `first_logits` [V].

    The model's cache must hold K rows and `limits.decode_positions` positions beyond the prompt. `eos_ids` are
    masked during the reasoning, so only `<|traj_future_start|>` ends it (as Alpamayo 2 does). With a tracer,
    the spans `reasoning_decode` (until the last row starts its trajectory) and `trajectory_decode` are recorded.
    `trajectory_tokens=False`: stop once every `<|traj_future_start|>` is in the cache (module docstring); the
    plans then carry no trajectory tokens and there is no `trajectory_decode` span.
    """
    k = len(sampler.generators)
    if first_logits.dim() != 1:
        raise ValueError(
            f"first_logits must be the last prompt position's logits [V], got {list(first_logits.shape)}"
        )
    masks = _Masks(vocab, first_logits.shape[0], eos_ids, first_logits.device)
    start_id, end_id = vocab.marker("traj_future_start"), vocab.marker(FILLER)
    model.fork(k)
    logits = first_logits.unsqueeze(0).expand(k, -1)
    phase = [REASONING] * k
    plans = [GeneratedPlan([], False, np.zeros(0, dtype=np.int64), []) for _ in range(k)]
    t_start = time.perf_counter_ns()
    t_switch = None
    while True:
        in_reasoning = torch.tensor([p == REASONING for p in phase], device=logits.device).unsqueeze(1)
        chosen = sampler(logits + torch.where(in_reasoning, masks.reasoning, masks.trajectory)).tolist()
        feed = []
        for r, token in enumerate(chosen):
            plan = plans[r]
            if phase[r] == REASONING:
                if len(plan.reasoning_token_ids) >= limits.max_reasoning_tokens:
                    token, plan.reasoning_capped = start_id, True
                if token == start_id:
                    phase[r] = TRAJECTORY if trajectory_tokens else DONE
                else:
                    plan.reasoning_token_ids.append(token)
            elif phase[r] == TRAJECTORY:
                plan.future_token_ids.append(token)
                if len(plan.future_token_ids) == limits.tokens_per_future:
                    phase[r] = DONE
            else:
                token = end_id
            feed.append(token)
        if t_switch is None and REASONING not in phase and trajectory_tokens:
            t_switch = time.perf_counter_ns()
        if all(p == DONE for p in phase) and trajectory_tokens:
            break
        logits = model.decode(torch.tensor(feed))
        if all(p == DONE for p in phase):  # the last <|traj_future_start|> has just entered the cache
            break
    if tracer is not None:
        t_end = time.perf_counter_ns()
        t_switch = t_switch or t_end
        tracer.record("reasoning_decode", t_start, t_switch - t_start, samples=k)
        if trajectory_tokens:
            tracer.record("trajectory_decode", t_switch, t_end - t_switch, samples=k)
    if trajectory_tokens:
        for plan in plans:
            plan.future_bins = vocab.future_bins(plan.future_token_ids)
    return plans

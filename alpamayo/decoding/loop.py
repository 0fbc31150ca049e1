"""The reasoning and trajectory-token loop over a prefilled model (Alpamayo's discrete trajectory path).

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
from typing import cast

import numpy as np
import torch

from alpamayo.contract import SpeculativeLM
from alpamayo.decoding.draft import Draft, DraftContext
from alpamayo.decoding.speculative import speculate
from alpamayo.generation import ForkableLM, TokenSampler
from alpamayo.prediction import Cancellation
from alpamayo.profiling.tracer import Tracer
from planner.plans import GeneratedPlan, PlanLimits
from planner.tokenizers import TrajectoryVocab

REASONING, TRAJECTORY, DONE = 0, 1, 2
FILLER = "traj_future_end"  # the marker fed to rows that have finished while others continue


class _Masks:
    """Additive logit biases [V] of the two phases: reasoning (trajectory tokens and `blocked_ids` at
    -inf, except `<|traj_future_start|>`, which ends it, as NVIDIA's `_append_text_eos_mask` keeps it; padding
    rows of the vocabulary stay open, as NVIDIA's masks leave them) and trajectory (everything but the
    future-trajectory tokens at -inf)."""

    def __init__(
        self, vocab: TrajectoryVocab, vocab_size: int, blocked_ids: Sequence[int], device: torch.device
    ):
        future = torch.as_tensor(vocab.future_ids, device=device)
        traj = torch.cat([future, torch.as_tensor(vocab.history_ids, device=device)])
        blocked = [i for i in blocked_ids if i != vocab.marker("traj_future_start")]
        self.reasoning = torch.zeros(vocab_size, device=device)
        self.reasoning[traj] = float("-inf")
        self.reasoning[torch.as_tensor(blocked, dtype=torch.long, device=device)] = float("-inf")
        self.trajectory = torch.full((vocab_size,), float("-inf"), device=device)
        self.trajectory[future] = 0.0


@dataclass
class _Phases:
    """The rows of the plain decode loop: each row's plan and phase (REASONING, TRAJECTORY, DONE), with what
    choosing a row's token needs."""

    plans: list[GeneratedPlan]
    phase: list[int]
    masks: _Masks
    sampler: TokenSampler
    limits: PlanLimits
    start_id: int
    end_id: int
    trajectory_tokens: bool

    def step(self, r: int, logits: torch.Tensor) -> int:
        """Row r's token to feed, chosen from its logits [V], and its phase advanced: a reasoning token (or
        `<|traj_future_start|>`, forced at the cap), a trajectory token, or the filler once the row is done."""
        plan = self.plans[r]
        done_before = len(plan.reasoning_token_ids)  # the row's generated position (TokenSampler.token)
        if self.phase[r] == REASONING:
            if done_before >= self.limits.max_reasoning_tokens:
                token, plan.reasoning_capped = self.start_id, True
            else:
                token = self.sampler.token(r, done_before, logits + self.masks.reasoning)
            if token == self.start_id:
                self.phase[r] = TRAJECTORY if self.trajectory_tokens else DONE
            else:
                plan.reasoning_token_ids.append(token)
        elif self.phase[r] == TRAJECTORY:  # after the reasoning and its <|traj_future_start|>
            position = done_before + 1 + len(plan.future_token_ids)
            token = self.sampler.token(r, position, logits + self.masks.trajectory)
            plan.future_token_ids.append(token)
            if len(plan.future_token_ids) == self.limits.tokens_per_future:
                self.phase[r] = DONE
        else:
            token = self.end_id
        return token


def generate_plans(
    model: ForkableLM,
    first_logits: torch.Tensor,
    vocab: TrajectoryVocab,
    sampler: TokenSampler,
    limits: PlanLimits = PlanLimits(),
    eos_ids: Sequence[int] = (),
    tracer: Tracer | None = None,
    trajectory_tokens: bool = True,
    draft: Draft | None = None,
    draft_context: DraftContext | None = None,
    first_draft: Sequence[int] = (),
    cancel: Cancellation | None = None,
) -> list[GeneratedPlan]:
    """K = sampler.rows samples after a prefill whose last-position logits are `first_logits` [V]
    (or [n + 1, V]: the prefill also verified the n tokens `first_draft` of `draft`, see `speculate`).

    The model's cache must hold K rows and `limits.decode_positions` positions beyond the prompt. `eos_ids` are
    masked during the reasoning, so only `<|traj_future_start|>` ends it (as Alpamayo 2 does). With a tracer,
    the spans `reasoning_decode` (until the last row starts its trajectory) and `trajectory_decode` are recorded.
    `trajectory_tokens=False`: stop once every `<|traj_future_start|>` is in the cache (module docstring); the
    plans then carry no trajectory tokens and there is no `trajectory_decode` span.

    Row r's token at generated position p (its reasoning tokens first, then `<|traj_future_start|>`, then the
    trajectory tokens) is `sampler.token(r, p, logits)`: a function of the row's seed, p and the logits.

    With a `draft` (and its `draft_context`), the reasoning is decoded speculatively
    (`alpamayo.decoding.speculative`): the same tokens as plain decoding, greedy or sampled, wherever the
    verify's logits equal the decode steps' (`TextModel.verify`; the ttnn backend to its PCC,
    docs/speculative.md); each plan then carries its accepted lengths (with a `first_draft`, the first is the
    prefill's block, timed by the caller's prefill span), and the tracer gets one `draft` and one `verify` span
    per verify block. The model must then be a `SpeculativeLM` (`verify` and `rollback`: the torch
    `TextModel`, the ttnn text model, or a VLM around either).

    `cancel` is checked before each decode step and each verify block (`PredictionCancelled`).
    """
    k = sampler.rows
    cancel = cancel or Cancellation()
    scored = _scored(first_logits, first_draft, draft)
    masks = _Masks(vocab, scored.shape[1], eos_ids, scored.device)
    start_id, end_id = vocab.marker("traj_future_start"), vocab.marker(FILLER)
    model.fork(k)
    logits = scored[0].unsqueeze(0).expand(k, -1)
    plans = [GeneratedPlan([], False, np.zeros(0, dtype=np.int64), []) for _ in range(k)]
    rows = _Phases(plans, [REASONING] * k, masks, sampler, limits, start_id, end_id, trajectory_tokens)
    t_start = time.perf_counter_ns()
    t_switch = None
    if draft is not None:
        logits, t_switch = _reason_speculatively(
            model, scored, first_draft, rows, draft, draft_context, tracer, cancel
        )
    t_switch = _decode(model, rows, logits, cancel, t_switch)
    if tracer is not None:
        _trace(tracer, k, t_start, t_switch, trajectory_tokens)
    if trajectory_tokens:
        for plan in plans:
            plan.future_bins = vocab.future_bins(plan.future_token_ids)
    return plans


def _reason_speculatively(
    model: ForkableLM,
    scored: torch.Tensor,
    first_draft: Sequence[int],
    rows: _Phases,
    draft: Draft,
    ctx: DraftContext | None,
    tracer: Tracer | None,
    cancel: Cancellation,
) -> tuple[torch.Tensor, int | None]:
    """Every row's reasoning decoded by `speculate`, then its `<|traj_future_start|>` fed: the logits [K, V]
    after it and the rows' phase advanced, with the time the trajectory starts (None without trajectory
    tokens)."""
    if ctx is None:
        raise ValueError("a draft needs its DraftContext (prompt ids, rows, stream, features)")
    k = len(rows.plans)
    speculate(
        cast(SpeculativeLM, model),
        scored,
        first_draft,
        rows.masks.reasoning,
        rows.sampler,
        rows.limits,
        draft,
        ctx,
        rows.plans,
        rows.start_id,
        rows.end_id,
        tracer,
        cancel,
    )
    logits = model.decode(
        torch.full((k,), rows.start_id)
    )  # every row's <|traj_future_start|> enters the cache
    rows.phase = [TRAJECTORY if rows.trajectory_tokens else DONE] * k
    return logits, time.perf_counter_ns() if rows.trajectory_tokens else None


def _scored(first_logits: torch.Tensor, first_draft: Sequence[int], draft: Draft | None) -> torch.Tensor:
    """The prefill's scored positions [n + 1, V] from `first_logits` [V] or [n + 1, V], checked against the n
    tokens of `first_draft` (which need a draft to decode the rest)."""
    scored = first_logits if first_logits.dim() == 2 else first_logits.unsqueeze(0)
    if scored.dim() != 2 or scored.shape[0] != len(first_draft) + 1:
        raise ValueError(
            f"first_logits must be [V] or [{len(first_draft) + 1}, V] (the last prompt position and the "
            f"{len(first_draft)} first drafted tokens), got {list(first_logits.shape)}"
        )
    if first_draft and draft is None:
        raise ValueError("first_draft was verified in the prefill, but no draft decodes the rest")
    return scored


def _decode(
    model: ForkableLM, rows: _Phases, logits: torch.Tensor, cancel: Cancellation, t_switch: int | None
) -> int | None:
    """Plain decode steps from `logits` [K, V] until every row is done (with `trajectory_tokens=False`: until
    the last `<|traj_future_start|>` has entered the cache): one `_Phases.step` per row, one decode of what the
    rows chose. Returns when the last row left its reasoning (`t_switch`, as given if it was already set)."""
    phase = rows.phase
    while any(p != DONE for p in phase):
        cancel.check()
        feed = [rows.step(r, logits[r]) for r in range(len(rows.plans))]
        if t_switch is None and REASONING not in phase and rows.trajectory_tokens:
            t_switch = time.perf_counter_ns()
        if all(p == DONE for p in phase) and rows.trajectory_tokens:
            break
        logits = model.decode(torch.tensor(feed))
        if all(p == DONE for p in phase):  # the last <|traj_future_start|> has just entered the cache
            break
    return t_switch


def _trace(tracer: Tracer, k: int, t_start: int, t_switch: int | None, trajectory_tokens: bool) -> None:
    """The spans `reasoning_decode` (until the last row starts its trajectory) and `trajectory_decode`."""
    t_end = time.perf_counter_ns()
    t_switch = t_switch or t_end
    tracer.record("reasoning_decode", t_start, t_switch - t_start, samples=k)
    if trajectory_tokens:
        tracer.record("trajectory_decode", t_switch, t_end - t_switch, samples=k)

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
from dataclasses import dataclass, field

import numpy as np
import torch

from alpamayo.drafts.base import Draft, DraftContext
from alpamayo.generation import ForkableLM, TokenSampler
from alpamayo.prediction import Cancellation
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
    accepted_lengths: list[int] = field(default_factory=list)  # per speculative block: tokens it produced


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


class SpeculativeLM(ForkableLM):
    """A `ForkableLM` that verifies blocks: `verify(ids [B, T], capture) -> logits [B, T, V]` (and the captured
    layer outputs), `rollback(lengths)`, per-row `lengths` and `max_verify_rows`, the most B x T one verify
    runs (None: no bound; ttnn: 32, one tile) (`alpamayo.text.model.TextModel`)."""

    lengths: list[int]
    max_verify_rows: int | None

    def verify(
        self, tokens: torch.Tensor, capture: Sequence[int] = ()
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...

    def rollback(self, lengths: Sequence[int]) -> None: ...


def first_draft(draft: Draft, ctx: DraftContext, limits: PlanLimits, start_id: int) -> list[int]:
    """The row-shared tokens `draft` proposes before the prefill to open the reasoning (`Draft.propose_first`),
    which the prefill then verifies (`TextModel.prefill_block`, `generate_plans(first_draft=...)`): at most
    block_size - 1 and the reasoning cap, cut before any `<|traj_future_start|>` as a block's drafts are."""
    room = min(draft.block_size - 1, limits.max_reasoning_tokens)
    return _clip(draft.propose_first(ctx, room), room, start_id)


def _clip(tokens: Sequence[int], room: int, start_id: int) -> list[int]:
    """At most `room` drafted tokens, none from `<|traj_future_start|>` on: the target always emits the stop
    itself, so the cap forces it at the same count as plain decoding."""
    d = list(tokens)[:room]
    return d[: d.index(start_id)] if start_id in d else d


def _speculate(
    model: SpeculativeLM,
    first_logits: torch.Tensor,
    first: Sequence[int],
    bias: torch.Tensor,
    sampler: TokenSampler,
    limits: PlanLimits,
    draft: Draft,
    ctx: DraftContext,
    plans: list[GeneratedPlan],
    start_id: int,
    filler: int,
    tracer: Tracer | None,
    cancel: Cancellation,
) -> None:
    """Decode every row's reasoning speculatively, up to (not including) its `<|traj_future_start|>`, which
    the caller feeds. `bias` [V]: the reasoning logit bias.

    The first block is the prefill's: `first` (n row-shared drafted tokens, `first_draft`) were fed after the
    prompt, `first_logits` [n + 1, V] are its last n + 1 positions; each row keeps its agreeing prefix of
    `first` and the target's own token after it as every block does, the cache rolled back to the prompt and
    that prefix (a row that rejects the first draft keeps just the prompt). With n = 0 the first token is the
    prefill's and no block is recorded.

    Each block feeds row r its pending token (chosen, not yet in the cache) and the draft's tokens after it,
    in one `verify`; position j's logits choose the token after the j-th fed one exactly as a plain decode
    step would (cap, bias, `TokenSampler.token` at the row's position: greedy or sampled, the very token plain
    decoding draws, since the verify's logits are plain decoding's bit for bit where the backend's are, see
    `TextModel.verify`), and the row keeps drafted tokens while they equal those tokens, then
    the target's own token (correction or bonus) becomes the next pending one. The cache is rolled back to
    the kept prefix. Drafts stop before `<|traj_future_start|>`, so it is always emitted by the target and
    the cap (`limits.max_reasoning_tokens`) forces it at the same count as plain decoding. A target that
    verifies at most `max_verify_rows` rows x tokens gets blocks of up to max_verify_rows // K tokens (the
    draft proposes fewer; which tokens are kept does not depend on it). `cancel` is checked before each block."""
    k = len(plans)
    cap = limits.max_reasoning_tokens
    block = (
        draft.block_size
        if model.max_verify_rows is None
        else min(draft.block_size, model.max_verify_rows // k)
    )
    capture = tuple(draft.capture)
    pending: list[int] = [0] * k
    done = [False] * k

    def take(r: int, logits: torch.Tensor, drafted: int | None) -> bool:
        """Row r's next token from `logits` [V] (the token plain decoding draws there: same position, same
        logits) against `drafted`: True iff it is the drafted one."""
        plan = plans[r]
        if len(plan.reasoning_token_ids) >= cap:
            token, plan.reasoning_capped = start_id, True
        else:
            token = sampler.token(r, len(plan.reasoning_token_ids), logits + bias)
        ok = token == drafted
        if token == start_id:
            done[r] = True
        else:
            plan.reasoning_token_ids.append(token)
        pending[r] = token
        return ok

    def accept(r: int, logits: torch.Tensor, drafted: Sequence[int]) -> int:
        """Row r's tokens from `logits` [len(drafted) + 1, V] (row j after the j-th fed token) while the target
        keeps `drafted`: the drafts kept (the token after them, the target's own, is then pending)."""
        j = 0
        while j <= len(drafted) and take(r, logits[j], drafted[j] if j < len(drafted) else None):
            j += 1
        return j

    draft.begin(ctx)
    opened = [accept(r, first_logits, first) for r in range(k)]
    if first:
        model.rollback([n - len(first) + j for n, j in zip(model.lengths, opened, strict=True)])
        for plan, j in zip(plans, opened, strict=True):
            plan.accepted_lengths.append(j + 1)
    while not all(done):
        cancel.check()
        t0 = time.perf_counter_ns()
        room = [
            0 if done[r] else max(0, min(block - 1, cap - len(p.reasoning_token_ids)))
            for r, p in enumerate(plans)
        ]
        proposed = draft.propose([p.reasoning_token_ids for p in plans], room)
        drafts = [_clip(d, room[r], start_id) for r, d in enumerate(proposed)]
        t1 = time.perf_counter_ns()
        width = 1 + max(len(d) for d in drafts)
        rows = [
            [filler] * width if done[r] else [pending[r], *d] + [filler] * (width - 1 - len(d))
            for r, d in enumerate(drafts)
        ]
        before = list(model.lengths)
        out = model.verify(torch.tensor(rows), capture) if capture else model.verify(torch.tensor(rows))
        logits, feats = out if capture else (out, None)
        kept = []
        for r, d in enumerate(drafts):
            if done[r]:
                kept.append(0)
                continue
            fed = [pending[r], *d[: accept(r, logits[r], d)]]
            kept.append(len(fed))
            plans[r].accepted_lengths.append(len(fed))
            draft.accepted(r, fed, None if feats is None else feats[r, : len(fed)])
        model.rollback([n + m for n, m in zip(before, kept, strict=True)])
        if tracer is not None:
            t2 = time.perf_counter_ns()
            tracer.record("draft", t0, t1 - t0, samples=k, drafted=sum(map(len, drafts)))
            tracer.record("verify", t1, t2 - t1, samples=k, tokens=width, accepted=sum(kept))
    draft.end([p.reasoning_token_ids for p in plans])


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
    (or [n + 1, V]: the prefill also verified the n tokens `first_draft` of `draft`, see `_speculate`).

    The model's cache must hold K rows and `limits.decode_positions` positions beyond the prompt. `eos_ids` are
    masked during the reasoning, so only `<|traj_future_start|>` ends it (as Alpamayo 2 does). With a tracer,
    the spans `reasoning_decode` (until the last row starts its trajectory) and `trajectory_decode` are recorded.
    `trajectory_tokens=False`: stop once every `<|traj_future_start|>` is in the cache (module docstring); the
    plans then carry no trajectory tokens and there is no `trajectory_decode` span.

    Row r's token at generated position p (its reasoning tokens first, then `<|traj_future_start|>`, then the
    trajectory tokens) is `sampler.token(r, p, logits)`: a function of the row's seed, p and the logits.

    With a `draft` (and its `draft_context`), the reasoning is decoded speculatively (`_speculate`): the
    same tokens as plain decoding, greedy or sampled, wherever the verify's logits equal the decode
    steps' (`TextModel.verify`; the ttnn backend to its PCC, docs/speculative.md); each plan then carries its
    accepted lengths (with a `first_draft`, the first is the prefill's block, timed by the caller's prefill
    span), and the tracer gets one `draft` and one `verify` span per verify block. The model must then
    be a `SpeculativeLM` (`verify` and `rollback`: the torch `TextModel`, the ttnn text model, or a VLM
    around either).

    `cancel` is checked before each decode step and each verify block (`PredictionCancelled`).
    """
    k = sampler.rows
    cancel = cancel or Cancellation()
    scored = first_logits if first_logits.dim() == 2 else first_logits.unsqueeze(0)
    if scored.dim() != 2 or scored.shape[0] != len(first_draft) + 1:
        raise ValueError(
            f"first_logits must be [V] or [{len(first_draft) + 1}, V] (the last prompt position and the "
            f"{len(first_draft)} first drafted tokens), got {list(first_logits.shape)}"
        )
    if first_draft and draft is None:
        raise ValueError("first_draft was verified in the prefill, but no draft decodes the rest")
    masks = _Masks(vocab, scored.shape[1], eos_ids, scored.device)
    start_id, end_id = vocab.marker("traj_future_start"), vocab.marker(FILLER)
    model.fork(k)
    logits = scored[0].unsqueeze(0).expand(k, -1)
    phase = [REASONING] * k
    plans = [GeneratedPlan([], False, np.zeros(0, dtype=np.int64), []) for _ in range(k)]
    t_start = time.perf_counter_ns()
    t_switch = None
    if draft is not None:
        if draft_context is None:
            raise ValueError("a draft needs its DraftContext (prompt ids, rows, stream, features)")
        _speculate(
            model,
            scored,
            first_draft,
            masks.reasoning,
            sampler,
            limits,
            draft,
            draft_context,
            plans,
            start_id,
            end_id,
            tracer,
            cancel,
        )
        logits = model.decode(
            torch.full((k,), start_id)
        )  # every row's <|traj_future_start|> enters the cache
        if not trajectory_tokens:
            phase = [DONE] * k
        else:
            phase = [TRAJECTORY] * k
            t_switch = time.perf_counter_ns()
    while any(p != DONE for p in phase):
        cancel.check()
        feed = []
        for r, plan in enumerate(plans):
            done_before = len(plan.reasoning_token_ids)  # the row's generated position (TokenSampler.token)
            if phase[r] == REASONING:
                if done_before >= limits.max_reasoning_tokens:
                    token, plan.reasoning_capped = start_id, True
                else:
                    token = sampler.token(r, done_before, logits[r] + masks.reasoning)
                if token == start_id:
                    phase[r] = TRAJECTORY if trajectory_tokens else DONE
                else:
                    plan.reasoning_token_ids.append(token)
            elif phase[r] == TRAJECTORY:  # after the reasoning and its <|traj_future_start|>
                position = done_before + 1 + len(plan.future_token_ids)
                token = sampler.token(r, position, logits[r] + masks.trajectory)
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

"""Speculative decoding of the reasoning: a draft proposes tokens, the target verifies a block of them per row in
one forward and keeps those plain decoding would have drawn, so the output is plain decoding's.

One prediction: the first block is the prefill's (`first_draft`), then per block the draft proposes (at most
`block_size` - 1 tokens per row, cut before `<|traj_future_start|>`), the target verifies (`SpeculativeLM.verify`),
each row accepts its agreeing prefix and the target's own token after it, and the cache is rolled back to what
was kept (`SpeculativeLM.rollback`). docs/speculative.md states why the tokens equal plain decoding's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import cast

import torch

from alpamayo.contract import SpeculativeLM
from alpamayo.decoding.draft import Draft, DraftContext
from alpamayo.generation import TokenSampler
from alpamayo.prediction import Cancellation
from alpamayo.profiling.tracer import Tracer
from planner.plans import GeneratedPlan, PlanLimits


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


def block_size(draft: Draft, model: SpeculativeLM, rows: int) -> int:
    """Tokens one row feeds per verify: the draft's block size, or fewer where the target verifies at most
    `max_verify_rows` rows x tokens (max_verify_rows // rows; which tokens are kept does not depend on it)."""
    return (
        draft.block_size
        if model.max_verify_rows is None
        else min(draft.block_size, model.max_verify_rows // rows)
    )


class _Rows:
    """The rows' reasoning state between blocks: each row's plan, its pending token (chosen, not yet in the
    cache) and whether it has chosen `<|traj_future_start|>`, with what choosing a token needs (the reasoning
    logit bias [V], the sampler, the cap)."""

    def __init__(
        self, plans: list[GeneratedPlan], sampler: TokenSampler, bias: torch.Tensor, cap: int, start_id: int
    ):
        self.plans, self.sampler, self.bias, self.cap, self.start_id = plans, sampler, bias, cap, start_id
        self.pending: list[int] = [0] * len(plans)
        self.done = [False] * len(plans)

    def take(self, r: int, logits: torch.Tensor, drafted: int | None) -> bool:
        """Row r's next token from `logits` [V] (the token plain decoding draws there: same position, same
        logits) against `drafted`: True iff it is the drafted one."""
        plan = self.plans[r]
        if len(plan.reasoning_token_ids) >= self.cap:
            token, plan.reasoning_capped = self.start_id, True
        else:
            token = self.sampler.token(r, len(plan.reasoning_token_ids), logits + self.bias)
        ok = token == drafted
        if token == self.start_id:
            self.done[r] = True
        else:
            plan.reasoning_token_ids.append(token)
        self.pending[r] = token
        return ok

    def accept(self, r: int, logits: torch.Tensor, drafted: Sequence[int]) -> int:
        """Row r's tokens from `logits` [len(drafted) + 1, V] (row j after the j-th fed token) while the target
        keeps `drafted`: the drafts kept (the token after them, the target's own, is then pending)."""
        j = 0
        while j <= len(drafted) and self.take(r, logits[j], drafted[j] if j < len(drafted) else None):
            j += 1
        return j

    def room(self, block: int) -> list[int]:
        """Per row, the most tokens the draft may propose for the next block: block - 1 within the cap (0 for
        a row that is done)."""
        return [
            0 if self.done[r] else max(0, min(block - 1, self.cap - len(p.reasoning_token_ids)))
            for r, p in enumerate(self.plans)
        ]

    def fed(self, drafts: Sequence[Sequence[int]], width: int, filler: int) -> list[list[int]]:
        """The block [rows][width] to verify: each row's pending token and its drafts, padded with `filler`
        (a row that is done gets filler only)."""
        return [
            [filler] * width if self.done[r] else [self.pending[r], *d] + [filler] * (width - 1 - len(d))
            for r, d in enumerate(drafts)
        ]


def speculate(
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
    prompt, `first_logits` [n + 1, V] are its last n + 1 positions (`_open`). With n = 0 the first token is the
    prefill's and no block is recorded.

    Each block feeds row r its pending token (chosen, not yet in the cache) and the draft's tokens after it,
    in one `verify` (`_verify_block`); position j's logits choose the token after the j-th fed one exactly as a
    plain decode step would (cap, bias, `TokenSampler.token` at the row's position: greedy or sampled, the very
    token plain decoding draws, since the verify's logits are plain decoding's bit for bit where the backend's
    are, see `TextModel.verify`), and the row keeps drafted tokens while they equal those tokens, then
    the target's own token (correction or bonus) becomes the next pending one. The cache is rolled back to
    the kept prefix. Drafts stop before `<|traj_future_start|>`, so it is always emitted by the target and
    the cap (`limits.max_reasoning_tokens`) forces it at the same count as plain decoding. A target that
    verifies at most `max_verify_rows` rows x tokens gets smaller blocks (`block_size`). `cancel` is checked
    before each block."""
    block = block_size(draft, model, len(plans))
    capture = tuple(draft.capture)
    rows = _Rows(plans, sampler, bias, limits.max_reasoning_tokens, start_id)
    draft.begin(ctx)
    _open(model, rows, first_logits, first)
    while not all(rows.done):
        cancel.check()
        _verify_block(model, rows, draft, block, capture, filler, tracer)
    draft.end([p.reasoning_token_ids for p in plans])


def _open(model: SpeculativeLM, rows: _Rows, first_logits: torch.Tensor, first: Sequence[int]) -> None:
    """The prefill's block: each row keeps its agreeing prefix of `first` and the target's own token after it
    as every block does, the cache rolled back to the prompt and that prefix (a row that rejects the first
    draft keeps just the prompt)."""
    opened = [rows.accept(r, first_logits, first) for r in range(len(rows.plans))]
    if first:
        model.rollback([n - len(first) + j for n, j in zip(model.lengths, opened, strict=True)])
        for plan, j in zip(rows.plans, opened, strict=True):
            plan.accepted_lengths.append(j + 1)


def _verify_block(
    model: SpeculativeLM,
    rows: _Rows,
    draft: Draft,
    block: int,
    capture: tuple[int, ...],
    filler: int,
    tracer: Tracer | None,
) -> None:
    """One block: the draft proposes, the target verifies every row's block in one forward, each row accepts
    (`_accept_all`) and the cache is rolled back to what the rows kept; with a tracer, its `draft` and `verify`
    spans."""
    t0 = time.perf_counter_ns()
    room = rows.room(block)
    proposed = draft.propose([p.reasoning_token_ids for p in rows.plans], room)
    drafts = [_clip(d, room[r], rows.start_id) for r, d in enumerate(proposed)]
    t1 = time.perf_counter_ns()
    width = 1 + max(len(d) for d in drafts)
    fed = rows.fed(drafts, width, filler)
    before = list(model.lengths)
    if capture:  # verify returns (logits, captured layers) exactly when asked to capture
        logits, feats = cast(tuple[torch.Tensor, torch.Tensor], model.verify(torch.tensor(fed), capture))
    else:
        logits, feats = cast(torch.Tensor, model.verify(torch.tensor(fed))), None
    kept = _accept_all(rows, draft, drafts, logits, feats)
    model.rollback([n + m for n, m in zip(before, kept, strict=True)])
    if tracer is not None:
        t2 = time.perf_counter_ns()
        k = len(rows.plans)
        tracer.record("draft", t0, t1 - t0, samples=k, drafted=sum(map(len, drafts)))
        tracer.record("verify", t1, t2 - t1, samples=k, tokens=width, accepted=sum(kept))


def _accept_all(
    rows: _Rows,
    draft: Draft,
    drafts: Sequence[Sequence[int]],
    logits: torch.Tensor,
    feats: torch.Tensor | None,
) -> list[int]:
    """Acceptance of one verified block (`logits` [K, width, V], the captured `feats` [K, width, n_layers * H]
    or None): per row, the tokens it keeps in the cache (its pending token and the accepted drafts; 0 for a row
    that was already done), each reported to the draft and recorded as the plan's accepted length."""
    kept = []
    for r, d in enumerate(drafts):
        if rows.done[r]:
            kept.append(0)
            continue
        fed = [rows.pending[r], *d[: rows.accept(r, logits[r], d)]]
        kept.append(len(fed))
        rows.plans[r].accepted_lengths.append(len(fed))
        draft.accepted(r, fed, None if feats is None else feats[r, : len(fed)])
    return kept

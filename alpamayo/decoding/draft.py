"""The one interface every speculative draft implements (model-free or a draft model)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class DraftContext:
    """What a draft sees of one prediction: the prompt's token ids [L] (row-shared), the number of rows, the
    stream the prediction belongs to (a camera stream, a replayed drive, an eval clip; None: none), and, for a
    draft that reads the target's hidden states, the prompt's captured layer outputs [L, n_layers * H]."""

    prompt_ids: Sequence[int]
    rows: int
    stream: str | None = None
    features: torch.Tensor | None = None


class Draft:
    """Proposes up to `block_size - 1` tokens per row; the target verifies them in one forward
    (`alpamayo.decoding.speculative`), keeping a drafted token iff it is the token plain decoding draws at
    its position (`alpamayo.generation.TokenSampler.token`), so what a draft proposes changes no output, only
    how many tokens one verify yields.

    Per prediction: `propose_first(ctx, limit)` before the prefill, `begin(ctx)` after it, then per block
    `propose(...)` and `accepted(...)`, then `end(reasoning)`. `capture`: target layers whose outputs the draft
    reads (`TextModel.verify(capture=...)`); empty for a model-free draft. `reads_target_context`: the
    prompt's captured layers are read from the target, not from `DraftContext.features`."""

    name = "draft"
    capture: tuple[int, ...] = ()
    reads_target_context = False  # True: `begin` reads the captured layers from the target itself (a device
    # draft reads them where the target's prefill left them), so `DraftContext.features` may be None

    def __init__(self, block_size: int):
        if not isinstance(block_size, int) or not 2 <= block_size <= 32:
            raise ValueError(
                f"draft block size must be an integer in [2, 32] (tokens per verify), got {block_size!r}"
            )
        self.block_size = block_size

    def propose_first(self, ctx: DraftContext, limit: int) -> list[int]:
        """At most `limit` tokens to open every row's reasoning, proposed before the prefill (`ctx.features`
        is still None) and verified inside it: the prompt and these tokens run as one forward, so the first
        block costs no verify of its own (`alpamayo.decoding.speculative.first_draft`). Row-shared: the rows
        fork after the prefill. The kept ones are not reported to `accepted` (they are in the cache before
        `begin`). Default: none, which a draft that reads the target's features must keep (they do not exist
        before the prefill)."""
        return []

    def begin(self, ctx: DraftContext) -> None:
        """A new prediction starts (its prompt is prefilled)."""

    def propose(self, generated: Sequence[Sequence[int]], limits: Sequence[int]) -> list[list[int]]:
        """Per row r, at most limits[r] (<= block_size - 1) tokens to follow `generated[r]` (the row's
        reasoning so far, ending with the token about to enter the cache); rows with limit 0 get []."""
        raise NotImplementedError

    def accepted(self, row: int, tokens: Sequence[int], features: torch.Tensor | None) -> None:
        """Row `row` kept `tokens` (the fed token and its accepted drafts, now in the cache); `features`
        [len(tokens), n_layers * H]: the target's captured layer outputs at those positions (None when
        `capture` is empty)."""

    def end(self, reasoning: Sequence[Sequence[int]]) -> None:
        """The prediction finished with these reasoning token ids per row."""

    def close(self) -> None:
        """Release what the draft holds beyond its Python objects (a device draft's tensors)."""

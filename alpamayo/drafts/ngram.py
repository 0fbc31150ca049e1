"""Model-free drafts by n-gram match: `lookup` (prompt lookup over the prompt's text and the tokens generated
so far) and `previous` (the previous prediction's reasoning of the same stream)."""

from __future__ import annotations

from collections.abc import Sequence

from alpamayo.decoding.draft import Draft, DraftContext

MAX_NGRAM = 3  # longest suffix matched (prompt lookup's usual 3); shorter suffixes are tried down to 1


def match_continuation(
    history: Sequence[int], source: Sequence[int], n: int, exclude_tail: bool, near: int | None = None
) -> list[int]:
    """The up to `n` tokens that follow the most recent occurrence in `source` of the longest suffix of
    `history` (MAX_NGRAM tokens down to 1); [] when nothing matches. With `near`, the occurrence whose end is
    closest to index `near` of `source` instead (a repeated phrase aligned by where the row is).

    With `exclude_tail`, `source` ends with `history` itself and that final occurrence does not count; the
    continuation then reads on into the tokens it has just drafted, so a repetition (period p) is drafted
    in full rather than cut at the end of `source`."""
    if n <= 0 or not history:
        return []
    src = list(source)
    for size in range(min(MAX_NGRAM, len(history)), 0, -1):
        key = list(history[-size:])
        last = len(src) - size - (1 if exclude_tail else 0)
        starts = range(last, -1, -1)
        if near is not None:
            starts = sorted(starts, key=lambda s: abs(s + size - near))
        for start in starts:
            if src[start : start + size] != key:
                continue
            if not exclude_tail:
                out = src[start + size : start + size + n]
            else:
                ext = list(src)
                for i in range(n):
                    ext.append(ext[start + size + i])
                out = ext[len(src) :]
            if out:
                return out
    return []


class LookupDraft(Draft):
    """Prompt lookup: the continuation of the longest recent n-gram match in the prompt's text tokens followed
    by the row's generated tokens."""

    name = "lookup"

    def __init__(self, block_size: int = 8):
        super().__init__(block_size)
        self.prompt: list[int] = []

    def propose_first(self, ctx: DraftContext, limit: int) -> list[int]:
        """The continuation of the prompt's own last n-gram where it occurred before in the prompt."""
        prompt = list(ctx.prompt_ids)
        return match_continuation(prompt, prompt, limit, exclude_tail=True)

    def begin(self, ctx: DraftContext) -> None:
        self.prompt = list(ctx.prompt_ids)

    def propose(self, generated: Sequence[Sequence[int]], limits: Sequence[int]) -> list[list[int]]:
        return [
            match_continuation(g, self.prompt + list(g), n, exclude_tail=True)
            for g, n in zip(generated, limits, strict=True)
        ]


class PreviousDraft(Draft):
    """The previous prediction's reasoning of the same stream, aligned by n-gram match (a vehicle at 10 Hz
    describes the same scene again and again). Keeps one reasoning per stream (row 0's)."""

    name = "previous"

    def __init__(self, block_size: int = 8):
        super().__init__(block_size)
        self.by_stream: dict[str, list[int]] = {}
        self.stream: str | None = None

    def propose_first(self, ctx: DraftContext, limit: int) -> list[int]:
        """The opening of the stream's previous reasoning (the same scene is described from its start)."""
        return self.by_stream.get(_stream_of(ctx), [])[:limit]

    def begin(self, ctx: DraftContext) -> None:
        self.stream = _stream_of(ctx)

    def propose(self, generated: Sequence[Sequence[int]], limits: Sequence[int]) -> list[list[int]]:
        before = self.by_stream.get(self.stream or "", [])
        return [
            match_continuation(g, before, n, exclude_tail=False, near=len(g))
            for g, n in zip(generated, limits, strict=True)
        ]

    def end(self, reasoning: Sequence[Sequence[int]]) -> None:
        if self.stream is not None and reasoning:
            self.by_stream[self.stream] = list(reasoning[0])


def _stream_of(ctx: DraftContext) -> str:
    """The prediction's stream, which `previous` needs (ValueError naming what is missing)."""
    if ctx.stream is None:
        raise ValueError(
            "draft 'previous' needs a stream to draw on (a camera stream, a replayed drive or an eval "
            "clip); this prediction has none"
        )
    return ctx.stream

"""Token generation loops over a prefilled model (separate from the model, as in gpt-fast)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch


class CausalLM(Protocol):
    """What `greedy_continue` needs from a prefilled model: decode(token) appends it -> float32 logits [V]."""

    def decode(self, tokens: int) -> torch.Tensor: ...


class ForkableLM(Protocol):
    """A prefilled model that can continue its prompt as n rows sharing the prompt's KV cache (text model or VLM).

    decode(ids [n]) appends one token per row and returns logits [n, V]."""

    def fork(self, n: int) -> None: ...

    def decode(self, tokens: torch.Tensor) -> torch.Tensor: ...


def greedy_continue(
    model: CausalLM, first_logits: torch.Tensor, max_new_tokens: int, stop_ids: Iterable[int] = ()
) -> list[int]:
    """Greedy tokens after a prefill whose last-position logits are `first_logits` [V] (`sample_continue`)."""
    return sample_continue(model, first_logits, TokenSampler(Sampling(), [0]), max_new_tokens, stop_ids)


def sample_continue(
    model: CausalLM,
    first_logits: torch.Tensor,
    sampler: TokenSampler,
    max_new_tokens: int,
    stop_ids: Iterable[int] = (),
) -> list[int]:
    """Tokens drawn by the one-row `sampler` after a prefill whose last-position logits are `first_logits` [V].

    Stops after `max_new_tokens` or after emitting a stop id (which is included, as `generate` does).
    """
    stop = set(stop_ids)
    tokens: list[int] = []
    logits = first_logits
    while len(tokens) < max_new_tokens:
        token = sampler.token(0, len(tokens), logits)
        tokens.append(token)
        if token in stop or len(tokens) == max_new_tokens:
            break
        logits = model.decode(token)
    return tokens


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: greedy (temperature 0) or softmax(logits / temperature) over the top_k most
    probable tokens (None: all) and then their top-p nucleus, in transformers' order. NVIDIA samples every
    released Alpamayo with temperature 0.6, top_p 0.98 and no top_k."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be None (no limit) or an integer >= 1, got {self.top_k!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def override(
        self, temperature: float | None = None, top_p: float | None = None, top_k: int | None = None
    ) -> Sampling:
        """These settings with the values that are given (not None) replaced: a command line's flags over a
        model family's defaults."""
        return Sampling(
            self.temperature if temperature is None else temperature,
            self.top_p if top_p is None else top_p,
            self.top_k if top_k is None else top_k,
        )


def nucleus_logits(
    logits: torch.Tensor, temperature: float, top_p: float, top_k: int | None = None
) -> torch.Tensor:
    """logits [B, V] / temperature, with -inf outside the top_k most probable tokens (ties at the k-th value
    kept, as transformers does) and then outside the top-p nucleus: the most probable tokens whose mass reaches
    top_p (a token is dropped once the more probable tokens already hold top_p; the top one is kept)."""
    scaled = logits.float() / temperature
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p >= 1:
        return scaled
    probs, order = torch.sort(scaled.softmax(dim=-1), dim=-1, descending=True)
    mass_before = probs.cumsum(dim=-1) - probs
    drop = mass_before >= top_p
    drop[..., 0] = False
    return scaled.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


def row_seeds(seed: int | None, rows: int, stream: int = 0) -> list[int]:
    """Independent 64-bit seeds for `rows` sample streams. Stream i depends only on (seed, i), so sample i is
    the same whether it runs alone or among others; seed None draws fresh entropy. `stream` > 0 gives another
    independent family from the same seed (the action expert's initial noise beside the token sampling)."""
    if seed is not None and (not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed must be None or an integer >= 0, got {seed!r}")
    children = np.random.SeedSequence(seed, spawn_key=(stream,) if stream else ()).spawn(rows)
    return [int(c.generate_state(1, np.uint64)[0]) for c in children]


class TokenSampler:
    """Chooses each row's token at each position as a function of (its row's seed, the position, the logits)
    alone: a row's p-th generated token (p = 0: the first after the prompt) is the same whichever tokens were
    drawn before it, however many rows run, and whether a plain decode step draws it or a speculative verify
    block checks a drafted token against it (`alpamayo.decoding.speculative`), so a draft changes no token.

    Greedy: the argmax. Sampling: inverse-CDF sampling of p = softmax(`nucleus_logits`), as `torch.multinomial`
    draws one sample, with the uniform keyed by (row seed, position) (`keyed_uniform`): the first token, in id
    order, whose cumulative weight exceeds u times the total: exactly p's distribution. The draw runs in
    float64 numpy (one thread, a sequential cumulative sum)."""

    def __init__(self, sampling: Sampling, seeds: Sequence[int]):
        self.sampling = sampling
        self.seeds = [int(s) for s in seeds]

    @classmethod
    def for_request(cls, sampling: Sampling, seed: int | None, rows: int) -> TokenSampler:
        return cls(sampling, row_seeds(seed, rows) if not sampling.greedy else [0] * rows)

    @property
    def rows(self) -> int:
        return len(self.seeds)

    def token(self, row: int, position: int, logits: torch.Tensor) -> int:
        """Row `row`'s token at generated position `position` (>= 0) from its logits [V] (biases added)."""
        if self.sampling.greedy:
            return int(torch.argmax(logits))
        s = self.sampling
        scaled = (
            nucleus_logits(logits.reshape(1, -1), s.temperature, s.top_p, s.top_k)[0].cpu().double().numpy()
        )
        weights = np.exp(scaled - scaled.max())  # 0 outside the nucleus
        cdf = np.cumsum(weights)
        token = int(np.searchsorted(cdf, keyed_uniform(self.seeds[row], position) * cdf[-1], side="right"))
        # u * total can round up to the total: the last token of positive weight then
        return min(token, int(np.flatnonzero(weights)[-1]))


def keyed_uniform(seed: int, position: int) -> float:
    """A uniform float64 in [0, 1) that is a function of (seed, position) alone: numpy's Philox, a counter-based
    generator, keyed by the pair (no state carried from one position to the next)."""
    if position < 0:
        raise ValueError(f"a sampled position is >= 0, got {position}")
    return float(np.random.Generator(np.random.Philox(key=[seed, position])).random())

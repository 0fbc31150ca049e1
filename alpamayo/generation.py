"""Token generation loops over a prefilled model (separate from the model, as in gpt-fast)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch


class CausalLM(Protocol):
    """What a generation loop needs: prefill a prompt, then decode one token at a time (both -> logits [V])."""

    def decode(self, tokens: int) -> torch.Tensor: ...


def greedy_continue(
    model: CausalLM, first_logits: torch.Tensor, max_new_tokens: int, stop_ids: Iterable[int] = ()
) -> list[int]:
    """Greedy tokens after a prefill whose last-position logits are `first_logits` [V].

    Stops after `max_new_tokens` or after emitting a stop id (which is included, as `generate` does).
    """
    stop = set(stop_ids)
    tokens: list[int] = []
    logits = first_logits
    while len(tokens) < max_new_tokens:
        token = int(torch.argmax(logits))
        tokens.append(token)
        if token in stop or len(tokens) == max_new_tokens:
            break
        logits = model.decode(token)
    return tokens

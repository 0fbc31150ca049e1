"""What one `alpamayo precision` comparison is run with: its sizes (`Settings`) and the progress callback every
stage reports to (`Progress`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Settings:
    """prompt_tokens: corpus tokens before the continuation; tokens: greedy continuation length; ticks,
    max_reasoning_tokens: drive predictions; max_seq_len: KV cache positions of the memory plans; eval_samples:
    samples of the eval-style minADE (alpamayo eval's default K) and rows of the torch GPU plan."""

    prompt_tokens: int = 64
    tokens: int = 32
    ticks: int = 3
    max_reasoning_tokens: int = 16
    max_seq_len: int = 4096
    eval_samples: int = 6

    def validate(self) -> None:
        names = ("prompt_tokens", "tokens", "ticks", "max_reasoning_tokens", "max_seq_len", "eval_samples")
        for name in names:
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")

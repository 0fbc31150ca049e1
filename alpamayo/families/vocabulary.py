"""The Alpamayo vocabulary: a base Qwen tokenizer extended in NVIDIA's fixed order, and its check against the
checkpoint's embedding table.

Order (`ReasoningVLA._build_tokenizer`): `<i0>`..`<i{N-1}>` as normal tokens (N = traj_vocab_size, 4000), then
the family's 29 `<|...|>` markers as special tokens (`add_special_tokens: true`; otherwise only the six
trajectory markers of `TRAJ_MARKERS`). On the real Qwen vocabulary (151669 tokens) that gives `<i0>` = 151669,
`<i3000>` = 154669, `<|traj_future_start|>` = 155681 and 155697 tokens, `<|image_pad|>` being already present.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from alpamayo.errors import CheckpointError
from alpamayo.families.registry import TRAJ_MARKERS


def marker(name: str) -> str:
    """`<|name|>`, the spelling of an Alpamayo marker token."""
    return f"<|{name}|>"


def bin_token(index: int) -> str:
    """`<i{index}>`, the spelling of trajectory bin token `index` (future bins first, then history bins)."""
    return f"<i{index}>"


def extend_tokenizer(
    tokenizer: Any, traj_vocab_size: int, markers: Sequence[str], add_special_tokens: bool = True
) -> Any:
    """Add the trajectory tokens and markers to `tokenizer` in place (see the module docstring); returns it."""
    added = tokenizer.add_tokens([bin_token(i) for i in range(traj_vocab_size)])
    if added != traj_vocab_size:
        raise CheckpointError(
            f"{tokenizer.name_or_path}: the base tokenizer already holds {traj_vocab_size - added} of the "
            f"trajectory tokens <i0>..<i{traj_vocab_size - 1}>; a base model's tokenizer must not"
        )
    names = markers if add_special_tokens else TRAJ_MARKERS
    tokenizer.add_tokens([marker(m) for m in names], special_tokens=True)
    return tokenizer


def complete_tokenizer(tokenizer: Any, traj_vocab_size: int, markers: Sequence[str]) -> int:
    """Add to `tokenizer`, in place, whichever of `<i0>`..`<i{N-1}>` (normal tokens) and then the `markers`
    (special tokens) it lacks, in that order; returns how many were added (0 for a tokenizer that ships them).

    Alpamayo 2 Super's rule (`build_alpamayo2_super_tokenizer`, run on the checkpoint's own tokenizer at every
    load): the same order as `extend_tokenizer`, but tokens already present are skipped, not refused.
    """
    before = len(tokenizer)
    tokenizer.add_tokens([bin_token(i) for i in range(traj_vocab_size)])
    tokenizer.add_tokens([marker(m) for m in markers], special_tokens=True)
    return len(tokenizer) - before


def check_embedding_rows(
    tokenizer_len: int, rows: int, exact: bool, tokenizer_from: str, tensor: str, file: str
) -> None:
    """The checkpoint's embedding table must have one row per token (`exact`: R1 / 1.5 size it to the extended
    tokenizer) or at least one (padded vocabularies: Super rounds up to a multiple of 128)."""
    if rows == tokenizer_len or (not exact and rows > tokenizer_len):
        return
    rule = "equal" if exact else "be at least"
    raise CheckpointError(
        f"{file}: tensor '{tensor}' has {rows} rows but the tokenizer ({tokenizer_from}) has {tokenizer_len} "
        f"tokens; they must {rule} (is the checkpoint's base model the one it was trained on?)"
    )

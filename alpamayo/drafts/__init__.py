"""Speculative drafts of the reasoning, one interface (`Draft`), chosen per run by a spec string:

    none           plain decoding (the default)
    lookup         prompt lookup: n-gram match over the prompt's text and the tokens generated so far
    previous       the previous prediction's reasoning of the same stream, aligned by n-gram match
    dflash:DIR     a DFlash draft checkpoint in z-lab's layout (`alpamayo.drafts.dflash`)

The target verifies each block in one forward (`alpamayo.decoding.speculative`); outputs are unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alpamayo.decoding.draft import Draft, DraftContext
from alpamayo.drafts.ngram import LookupDraft, PreviousDraft

KINDS = ("none", "lookup", "previous", "dflash:DIR")
MODEL_FREE_BLOCK = 8  # tokens per verify of the model-free drafts (DFlash's published block size)


def check_draft_spec(spec: str) -> str:
    """`spec` itself if it names a draft kind (ValueError naming the allowed ones otherwise); a DFlash
    directory must exist."""
    if spec in ("none", "lookup", "previous"):
        return spec
    if spec.startswith("dflash:") and spec[len("dflash:") :]:
        directory = Path(spec[len("dflash:") :])
        if not directory.is_dir():
            raise ValueError(f"draft {spec!r}: {directory} is not a directory")
        return spec
    raise ValueError(f"draft must be one of {', '.join(KINDS)}, got {spec!r}")


def load_draft(spec: str, target: Any) -> Draft | None:
    """The draft `spec` names for the torch text model `target` (None for `none`)."""
    spec = check_draft_spec(spec)
    if spec == "none":
        return None
    if spec == "lookup":
        return LookupDraft(MODEL_FREE_BLOCK)
    if spec == "previous":
        return PreviousDraft(MODEL_FREE_BLOCK)
    from alpamayo.drafts.dflash import DFlashDraft

    return DFlashDraft.load(spec[len("dflash:") :], target)


__all__ = [
    "MODEL_FREE_BLOCK",
    "Draft",
    "DraftContext",
    "LookupDraft",
    "PreviousDraft",
    "check_draft_spec",
    "load_draft",
]

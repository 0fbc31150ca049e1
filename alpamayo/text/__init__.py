"""Torch reference Qwen3-VL text decoder (the oracle for the ttnn backend)."""

from alpamayo.text.model import TextModel

__all__ = ["TextModel"]

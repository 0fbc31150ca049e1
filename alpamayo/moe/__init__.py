"""Mixture-of-experts blocks: the Qwen3-VL-MoE sparse MLP and the hardware-shaped MoE block it runs on."""

from alpamayo.moe.block import Dispatch, MoEBlock, SparseMoE
from alpamayo.moe.config import MoEBlockConfig
from alpamayo.moe.router import TopKRouter

__all__ = ["Dispatch", "MoEBlock", "MoEBlockConfig", "SparseMoE", "TopKRouter"]

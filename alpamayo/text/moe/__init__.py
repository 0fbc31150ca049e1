"""Mixture-of-experts blocks: the Qwen3-VL-MoE sparse MLP and the hardware-shaped MoE block it runs on."""

from alpamayo.config.moe import MoEBlockConfig
from alpamayo.text.moe.block import Dispatch, MoEBlock, SparseMoE
from alpamayo.text.moe.router import TopKRouter

__all__ = ["Dispatch", "MoEBlock", "MoEBlockConfig", "SparseMoE", "TopKRouter"]

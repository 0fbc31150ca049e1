"""Mixture-of-experts blocks, part of the text backbone: the Qwen3-VL-MoE sparse MLP and the hardware-shaped
MoE block it runs on. Their settings are `alpamayo.config.moe` (`MoEConfig`, `MoEBlockConfig`).

    router   the top-k router (`TopKRouter`)
    block    the MoE block (dispatch -> compute -> combine, `MoEBlock`) and the sparse layer (`SparseMoE`)
    weights  one sparse layer's expert tensors in a single in-memory layout, whatever the disk layout
"""

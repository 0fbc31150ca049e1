"""The flow-matching action expert: the trajectory decoder NVIDIA's Alpamayo releases use for inference.

It reads the VLM's KV cache after `<|traj_future_start|>` and turns noise into normalised (acceleration,
curvature) actions in a few Euler steps. `config` derives its settings from a checkpoint's `config.json`.
"""

from alpamayo.expert.config import (
    ExpertConfig,
    InProjConfig,
    WeightPrefixes,
    expert_text_dict,
    has_expert,
    parse_expert_config,
    validate_against_vlm,
)

__all__ = [
    "ExpertConfig",
    "InProjConfig",
    "WeightPrefixes",
    "expert_text_dict",
    "has_expert",
    "parse_expert_config",
    "validate_against_vlm",
]

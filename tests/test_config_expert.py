"""The action expert's config from each family's raw config.json fields, its weight names, and the checks
against the VLM (layer count, K/V layout)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import Qwen3VLTextConfig, Qwen3VLTextModel

from alpamayo.config.builtin import CONFIG_DIR
from alpamayo.config.expert import (
    FLAT,
    RELEASE_10B_EXPERT,
    SUPER,
    has_expert,
    parse_expert_config,
    validate_against_vlm,
)
from alpamayo.config.model import parse_text_config
from alpamayo.errors import ConfigError
from alpamayo.json_fields import Fields
from tests.hf_checkpoints import text_config

VLM_8B_TEXT = json.loads((CONFIG_DIR / "qwen3-vl-8b.json").read_text())["text_config"]
# The 10B releases' expert blocks with `_target_` spelled as Hydra writes it.
RELEASE_FLAT = copy.deepcopy(RELEASE_10B_EXPERT) | {"model_type": "alpamayo1_5"}
RELEASE_FLAT["action_in_proj_cfg"]["_target_"] = "alpamayo1_5.models.action_in_proj.PerWaypointActionInProjV2"
RELEASE_FLAT["action_out_proj_cfg"]["_target_"] = "torch.nn.Linear"
RELEASE_FLAT["diffusion_cfg"]["_target_"] = "alpamayo1_5.diffusion.flow_matching.FlowMatching"
TINY_TEXT = text_config(vocab_size=300)


def vlm_text(raw: dict):
    return parse_text_config(Fields(raw, "text_config", "vlm"))


def test_release_flat_config_copies_the_vlm_text_config_with_expert_cfg():
    cfg = parse_expert_config(RELEASE_FLAT, VLM_8B_TEXT)
    assert cfg is not None and cfg.layout == FLAT and cfg.non_causal
    # NVIDIA's FlowMatching defaults: guidance weight 1 (pure guided), any noise temperature
    assert (cfg.guidance_weight, cfg.guided_temperature) == (1.0, None)
    t = cfg.text
    assert (t.hidden_size, t.num_attention_heads, t.head_dim, t.intermediate_size) == (2048, 16, 128, 8256)
    # Inherited from the VLM: the layer count and the K/V layout that let it read the VLM cache.
    assert (t.num_hidden_layers, t.num_key_value_heads, t.rope_theta) == (36, 8, 5_000_000.0)
    assert t.mrope_section == (24, 20, 20) and t.moe is None
    assert (cfg.in_proj.num_enc_layers, cfg.in_proj.hidden_size, cfg.in_proj.num_features) == (2, 512, 60)
    assert cfg.num_inference_steps == 10
    validate_against_vlm(cfg, vlm_text(VLM_8B_TEXT))
    shapes = cfg.weight_shapes()
    # 36 x 11 layer tensors + expert.norm + 10 in-projection + 2 out-projection tensors (audit B.3: 409).
    assert len(shapes) == 36 * 11 + 1 + 10 + 2
    assert shapes["expert.layers.0.self_attn.k_proj.weight"] == (1024, 2048)
    assert shapes["action_in_proj.encoder.trunk.0.weight"] == (512, 60)
    assert shapes["action_in_proj.encoder.trunk.5.weight"] == (512,)
    assert shapes["action_in_proj.encoder.trunk.6.weight"] == (2048, 512)
    assert shapes["action_out_proj.weight"] == (2, 2048)
    n_params = sum(torch.Size(s).numel() for s in shapes.values())
    assert n_params == 2_280_592_386  # the model card's "2.3B" (audit B.3 arithmetic)
    assert cfg.freqs_keys()[-1] == "action_in_proj.timestep_fourier_encoder.freqs"
    # The VLM's dict is copied, never modified.
    assert VLM_8B_TEXT["hidden_size"] == 4096


def test_text_dict_builds_transformers_expert_with_the_same_weight_names_and_shapes():
    cfg = parse_expert_config(
        dict(RELEASE_FLAT, expert_cfg={"hidden_size": 48, "intermediate_size": 80}), TINY_TEXT
    )
    hf = Qwen3VLTextModel(Qwen3VLTextConfig(**cfg.text_dict))
    del hf.embed_tokens  # as NVIDIA's model does
    hf_shapes = {f"expert.{k}": tuple(v.shape) for k, v in hf.state_dict().items()}
    ours = {k: v for k, v in cfg.weight_shapes().items() if k.startswith("expert.")}
    assert ours == hf_shapes
    assert hf.config.hidden_size == 48 and hf.config.num_key_value_heads == 2


def test_super_uses_its_full_llm_config_and_nested_prefixes():
    raw = {
        "model_type": "alpamayo2_super",
        "vlm_config": {"text_config": TINY_TEXT},
        "expert_config": {
            "llm_config": dict(TINY_TEXT, hidden_size=32, num_attention_heads=2, intermediate_size=40),
            "action_space_cfg": {"n_waypoints": 64},
            "action_in_proj_cfg": {"num_enc_layers": 1, "hidden_size": 24},
            "diffusion_cfg": {"num_inference_steps": 6},
            "expert_non_causal_attention": True,
        },
    }
    assert has_expert(raw)
    cfg = parse_expert_config(raw)
    assert cfg.layout == SUPER
    # the guided example's weight is the config's (default 1.0) and its noise temperature 1
    assert (cfg.guidance_weight, cfg.guided_temperature) == (1.0, 1.0)
    raw["expert_config"]["diffusion_cfg"]["inference_guidance_weight"] = 2.5
    assert parse_expert_config(raw).guidance_weight == 2.5
    assert (cfg.text.hidden_size, cfg.text.num_hidden_layers, cfg.num_inference_steps) == (32, 2, 6)
    shapes = cfg.weight_shapes()
    assert "expert.expert.layers.1.mlp.down_proj.weight" in shapes
    assert shapes["expert.action_in_proj.encoder.trunk.3.weight"] == (32, 24)
    assert shapes["expert.action_out_proj.bias"] == (2,)
    validate_against_vlm(cfg, vlm_text(TINY_TEXT))
    # Super builds its expert only with an action space (its `enable_expert` rule).
    assert not has_expert({"expert_config": {"llm_config": TINY_TEXT}})


def test_super_config_that_turns_guidance_on_is_refused_as_nvidia_refuses_it():
    """NVIDIA's `ExpertModel` raises on `diffusion_cfg.use_classifier_free_guidance: true`; its guidance is
    asked for at sampling. The flat layout's sampler reads the flag at sampling only, so it loads."""
    raw = {
        "model_type": "alpamayo2_super",
        "expert_config": {
            "llm_config": dict(TINY_TEXT),
            "action_space_cfg": {"n_waypoints": 64},
            "diffusion_cfg": {"use_classifier_free_guidance": True},
        },
    }
    with pytest.raises(
        ConfigError,
        match=r"'expert_config.diffusion_cfg.use_classifier_free_guidance' = true, which NVIDIA's "
        r"Alpamayo2Super refuses to load",
    ):
        parse_expert_config(raw)
    flat = copy.deepcopy(RELEASE_FLAT)
    flat["diffusion_cfg"]["use_classifier_free_guidance"] = True
    assert parse_expert_config(flat, VLM_8B_TEXT) is not None


def test_no_expert_keys_means_no_expert():
    assert parse_expert_config({"vlm_config": {"text_config": TINY_TEXT}}) is None
    assert parse_expert_config({"expert_cfg": {}}, TINY_TEXT) is not None  # a plain copy of the VLM's config


def test_layer_count_mismatch_names_both_values():
    cfg = parse_expert_config(dict(RELEASE_FLAT, expert_cfg={"num_hidden_layers": 3}), TINY_TEXT)
    with pytest.raises(ConfigError, match=r"action expert has 3 layers but the VLM has 2"):
        validate_against_vlm(cfg, vlm_text(TINY_TEXT))


@pytest.mark.parametrize(
    "expert_cfg, expert_says, vlm_says",
    [
        (
            {"num_key_value_heads": 4},
            "KV width 64 (num_key_value_heads 4 x head_dim 16)",
            "VLM's 32 (2 x 16)",
        ),
        (
            {"head_dim": 32, "rope_parameters": dict(TINY_TEXT["rope_parameters"], mrope_section=[8, 4, 4])},
            "KV width 64 (num_key_value_heads 2 x head_dim 32)",
            "VLM's 32 (2 x 16)",
        ),
    ],
)
def test_kv_layout_mismatch_names_both_values(expert_cfg, expert_says, vlm_says):
    cfg = parse_expert_config(dict(RELEASE_FLAT, expert_cfg=expert_cfg), TINY_TEXT)
    with pytest.raises(ConfigError) as e:
        validate_against_vlm(cfg, vlm_text(TINY_TEXT))
    assert expert_says in str(e.value) and vlm_says in str(e.value)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("diffusion_cfg", {"int_method": "heun"}, "unsupported 'diffusion_cfg.int_method' = 'heun'"),
        (
            "diffusion_cfg",
            {"num_inference_steps": 0},
            "'diffusion_cfg.num_inference_steps' must be an integer",
        ),
        ("action_in_proj_cfg", {"_target_": "x.PerWaypointActionInProj"}, "supported: a class named "),
        (
            "action_in_proj_cfg",
            {"num_fourier_feats": 21},
            "'action_in_proj_cfg.num_fourier_feats' must be even",
        ),
        ("action_out_proj_cfg", {"_target_": "x.MLP"}, "'action_out_proj_cfg._target_' = 'x.MLP'"),
        ("expert_cfg", {"hidden_act": "gelu"}, "unsupported '<VLM text_config + expert_cfg>.hidden_act'"),
    ],
)
def test_bad_fields_are_config_errors_naming_the_field(key, value, message):
    raw = dict(RELEASE_FLAT, expert_cfg={})  # a plain copy of the tiny VLM config
    raw[key] = value
    with pytest.raises(ConfigError) as e:
        parse_expert_config(raw, TINY_TEXT, source="ckpt/config.json")
    assert message in str(e.value) and str(e.value).startswith("ckpt/config.json: ")


def test_flat_expert_without_vlm_text_config_is_a_config_error():
    with pytest.raises(ConfigError, match="no VLM text config was given"):
        parse_expert_config(RELEASE_FLAT, None)

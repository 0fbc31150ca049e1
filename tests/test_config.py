"""config.json parsing: both rope spellings, both expert-count keys, tied heads, the Alpamayo layout, errors."""

from __future__ import annotations

import copy
import json

import pytest

from alpamayo.checkpoint import canonical_name
from alpamayo.config.builtin import CONFIG_DIR, NAMES, builtin_config
from alpamayo.config.loader import load_model_config
from alpamayo.config.model import parse_config
from alpamayo.errors import ConfigError
from alpamayo.text.weights import text_tensor_shapes

HUB_2B = json.loads((CONFIG_DIR / "qwen3-vl-2b.json").read_text())
HUB_MOE = json.loads((CONFIG_DIR / "qwen3-vl-30b-a3b.json").read_text())


def v5_spelling(raw: dict) -> dict:
    """The transformers-5 save_pretrained spelling of a hub config."""
    out = copy.deepcopy(raw)
    text = out["text_config"]
    rope = text.pop("rope_scaling")
    text["rope_parameters"] = dict(rope, rope_theta=float(text.pop("rope_theta")))
    if "num_experts" in text:
        text["num_local_experts"] = text.pop("num_experts")
    return out


def test_hub_and_v5_rope_spellings_parse_identically():
    hub, v5 = parse_config(HUB_2B), parse_config(v5_spelling(HUB_2B))
    assert hub == v5
    assert hub.text.rope_theta == 5_000_000.0 and hub.text.mrope_section == (24, 20, 20)
    assert hub.kind == "dense" and hub.tie_word_embeddings and hub.text.head_dim == 128


def test_moe_num_experts_and_num_local_experts():
    hub, v5 = parse_config(HUB_MOE), parse_config(v5_spelling(HUB_MOE))
    assert hub.text.moe == v5.text.moe
    assert hub.kind == "moe" and hub.text.moe.num_experts == 128 and hub.text.moe.num_experts_per_tok == 8
    assert not hub.tie_word_embeddings


def test_sparse_layer_rule_follows_transformers():
    raw = copy.deepcopy(HUB_MOE)
    raw["text_config"].update(decoder_sparse_step=2, mlp_only_layers=[3])
    moe = parse_config(raw).text.moe
    assert [moe.is_sparse(i) for i in range(6)] == [False, True, False, False, False, True]


def test_alpamayo_nested_layout():
    raw = {"model_type": "alpamayo_vla", "traj_vocab_size": 4000, "vlm_config": v5_spelling(HUB_2B)}
    cfg = parse_config(raw)
    assert cfg.weight_prefix == "vlm." and cfg.is_alpamayo
    assert cfg.text == parse_config(HUB_2B).text
    assert cfg.extra == {"model_type": "alpamayo_vla", "traj_vocab_size": 4000}


@pytest.mark.parametrize("name", NAMES)
def test_builtin_config_tensor_shapes_match_transformers(name):
    """Our text tensor spec for each published config equals transformers' own state dict (meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    cfg = builtin_config(name)
    hf_cfg = AutoConfig.from_pretrained(CONFIG_DIR / f"{name}.json")
    with torch.device("meta"):
        hf = AutoModelForImageTextToText.from_config(hf_cfg)
    hf_shapes = {canonical_name(k): tuple(v.shape) for k, v in hf.state_dict().items()}
    hf_text = {k: v for k, v in hf_shapes.items() if k.startswith(("language_model.", "lm_head."))}
    if cfg.tie_word_embeddings:
        del hf_text["lm_head.weight"]  # tied: not stored on disk
    ours = text_tensor_shapes(cfg)
    assert set(ours) == set(hf_text)
    assert all(hf_text[k] in ours[k] for k in ours)


def test_unknown_architecture_names_the_field():
    raw = dict(HUB_2B, architectures=["LlamaForCausalLM"])
    with pytest.raises(
        ConfigError, match=r"unsupported architecture \['LlamaForCausalLM'\] in field 'architectures'"
    ):
        parse_config(raw)


def test_unknown_model_type_without_architectures():
    raw = {k: v for k, v in HUB_2B.items() if k != "architectures"}
    raw["model_type"] = "llava"
    with pytest.raises(ConfigError, match="unsupported model_type 'llava' in field 'model_type'"):
        parse_config(raw)


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "vocab_size", "rms_norm_eps"])
def test_missing_text_field_is_named(field):
    raw = copy.deepcopy(HUB_2B)
    del raw["text_config"][field]
    with pytest.raises(ConfigError, match=f"missing field 'text_config.{field}'"):
        parse_config(raw)


def test_missing_vision_field_inside_alpamayo_layout_is_named():
    raw = {"vlm_config": copy.deepcopy(HUB_2B)}
    del raw["vlm_config"]["vision_config"]["depth"]
    with pytest.raises(ConfigError, match=r"missing field 'vlm_config.vision_config.depth'"):
        parse_config(raw)


def test_missing_expert_count_is_named():
    raw = copy.deepcopy(HUB_MOE)
    del raw["text_config"]["num_experts"]
    with pytest.raises(
        ConfigError, match=r"missing field 'text_config.num_experts' \(or 'num_local_experts'\)"
    ):
        parse_config(raw)


def test_wrong_type_is_reported_with_value():
    raw = copy.deepcopy(HUB_2B)
    raw["text_config"]["num_attention_heads"] = "16"
    with pytest.raises(
        ConfigError, match=r"field 'text_config.num_attention_heads' must be an integer >= 1, got '16'"
    ):
        parse_config(raw)


def test_unsupported_rope_type_and_bad_sections():
    raw = copy.deepcopy(HUB_2B)
    raw["text_config"]["rope_scaling"]["rope_type"] = "yarn"
    with pytest.raises(ConfigError, match="unsupported rope type 'yarn'"):
        parse_config(raw)
    raw = copy.deepcopy(HUB_2B)
    raw["text_config"]["rope_scaling"]["mrope_section"] = [24, 20, 19]
    with pytest.raises(ConfigError, match="summing to head_dim/2 = 64"):
        parse_config(raw)


def test_gqa_heads_must_divide():
    raw = copy.deepcopy(HUB_2B)
    raw["text_config"]["num_key_value_heads"] = 7
    with pytest.raises(ConfigError, match="is not a multiple of"):
        parse_config(raw)


def test_load_config_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"missing: checkpoint directory does not exist"):
        load_model_config(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"no config.json"):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"config.json: not valid JSON"):
        load_model_config(tmp_path)


def test_generation_config_eos_ids(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(HUB_2B))
    assert load_model_config(tmp_path).eos_token_ids == (151645,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    assert load_model_config(tmp_path).eos_token_ids == (151645, 151643)

"""Precision recipes of the ttnn backend: presets, YAML loading and the errors that name field and values."""

from __future__ import annotations

import pytest

from alpamayo.errors import ConfigError
from alpamayo.plan.precision import OP_GROUPS, PRESETS, TENSOR_GROUPS, Precision, load_precision


def test_performance_preset_is_bfp4_mlp_bfp8_attention():
    perf = PRESETS["performance"]
    assert (perf.dtype("mlp_gate_up"), perf.dtype("mlp_down")) == ("bfp4", "bfp4")
    assert (perf.dtype("qkv"), perf.dtype("o")) == ("bfp8", "bfp8")
    assert perf.math_fidelity("mlp_gate_up") == "lofi" and perf.math_fidelity("qkv") == "hifi2"


def test_accuracy_preset_keeps_a_bf16_cache_and_hifi4_math():
    acc = PRESETS["accuracy"]
    assert acc.dtype("kv_cache") == "bf16"
    assert {acc.math_fidelity(op) for op in OP_GROUPS} == {"hifi4"}
    assert {acc.dtype(g) for g in TENSOR_GROUPS if g != "kv_cache"} == {"bfp8"}


def test_yaml_recipe_overrides_its_base(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "name: mine\nbase: performance\ndtypes: {lm_head: bf16, kv_cache: bf16}\nfidelity: {o: hifi4}\n"
    )
    recipe = load_precision(str(path))
    assert recipe.name == "mine"
    assert recipe.dtype("lm_head") == "bf16" and recipe.dtype("mlp_down") == "bfp4"
    assert recipe.math_fidelity("o") == "hifi4" and recipe.math_fidelity("qkv") == "hifi2"
    assert Precision.from_dict(recipe.to_dict(), "round trip") == recipe


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "base: performance\ndtypes: {mlp: bfp4}\n",
            r"unknown dtypes group\(s\) \['mlp'\]; allowed: qkv, o,",
        ),
        ("base: performance\ndtypes: {qkv: fp8}\n", r"dtypes.qkv = 'fp8'; allowed: bf16, bfp8, bfp4"),
        ("base: performance\ndtypes: {kv_cache: bfp4}\n", r"dtypes.kv_cache = 'bfp4'; allowed: bf16, bfp8"),
        ("base: performance\nfidelity: {sdpa: hifi5}\n", r"fidelity.sdpa = 'hifi5'; allowed: lofi, hifi2"),
        ("base: fast\n", r"base = 'fast'; allowed: accuracy, performance"),
        ("dtypes: {qkv: bfp8}\n", r"dtypes has no entry for \['o', 'mlp_gate_up'"),
        ("base: performance\nprecision: {}\n", r"unknown field\(s\) \['precision'\]"),
        ("- bfp8\n", r"must be a mapping, got list"),
    ],
)
def test_bad_recipe_names_the_field_and_the_allowed_values(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_precision(str(path))


def test_unknown_recipe_name_lists_the_presets(tmp_path):
    with pytest.raises(ConfigError, match=r"--recipe 'fastest': not a preset \(accuracy, performance\)"):
        load_precision("fastest")

"""`ModelSpec`: one value says what to load and how to run it. The command-line flags, the dict form (the node
YAML's `model:` keys, eval's run records) and the spec carry the same keys and values; bad values are refused
naming the key (or, on the command line, the flag); and every command that loads a model takes the same model
flags."""

from __future__ import annotations

import argparse

import pytest
import yaml

from alpamayo.cli import COMMANDS, build_parser, command_name, main
from alpamayo.commands.common import SPEC_KEYS, add_model_args, model_spec
from alpamayo.config.flow import FlowSettings
from alpamayo.errors import ConfigError
from alpamayo.model_spec import ModelSpec
from alpamayo.quant.recipe import QuantRecipe
from bridges.node.config import ModelSection, NodeConfig

# The commands that load an AlpamayoVLA; `generate` loads the text backbone / VLM only, so it takes what to
# load but not how the runtime decodes.
RUNTIME_COMMANDS = ("predict", "ask", "replay", "profile", "eval", "closed-loop", "alpasim-driver", "serve")
LOAD_FLAGS = (
    "--checkpoint",
    "--base-model",
    "--backend",
    "--dtype",
    "--device",
    "--recipe",
    "--tt-cache",
    "--moe-config",
    "--tt-mode",
    "--quant",
    "--quant-group",
    "--quant-head",
    "--quant-cache",
    "--reproducible",
)
DECODING_FLAGS = (
    "--temperature",
    "--top-p",
    "--top-k",
    "--max-reasoning-tokens",
    "--decoder",
    "--draft",
    "--flow-steps",
    "--flow-temperature",
    "--nav-guidance",
)

FLAGS = [
    "--checkpoint",
    "ckpt",
    "--base-model",
    "base",
    "--backend",
    "torch",
    "--dtype",
    "bfloat16",
    "--device",
    "cuda:1",
    "--recipe",
    "accuracy",
    "--tt-cache",
    "tt",
    "--moe-config",
    "moe.yaml",
    "--tt-mode",
    "golden",
    "--quant",
    "int4",
    "--quant-group",
    "64",
    "--quant-head",
    "--quant-cache",
    "packed",
    "--reproducible",
    "--temperature",
    "0.6",
    "--top-p",
    "0.9",
    "--top-k",
    "40",
    "--max-reasoning-tokens",
    "12",
    "--decoder",
    "expert",
    "--draft",
    "lookup",
    "--flow-steps",
    "4",
    "--flow-temperature",
    "0.5",
    "--nav-guidance",
    "1.5",
]


def options(command: str) -> set[str]:
    """The option strings of one sub-command's parser."""
    parser = build_parser([m for m in COMMANDS if command_name(m) == command])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {s for action in sub.choices[command]._actions for s in action.option_strings}


def test_flags_to_spec_to_dict_to_spec_round_trip():
    parser = argparse.ArgumentParser()
    add_model_args(parser)
    spec = model_spec(parser.parse_args(FLAGS))
    assert spec == ModelSpec(
        checkpoint="ckpt",
        base_model="base",
        dtype="bfloat16",
        device="cuda:1",
        recipe="accuracy",
        tt_cache="tt",
        moe_config="moe.yaml",
        tt_mode="golden",
        quant="int4",
        quant_group=64,
        quant_head=True,
        quant_cache="packed",
        reproducible=True,
        temperature=0.6,
        top_p=0.9,
        top_k=40,
        max_reasoning_tokens=12,
        decoder="expert",
        draft="lookup",
        flow_steps=4,
        flow_temperature=0.5,
        nav_guidance=1.5,
    )
    # the typed views the loaders take
    assert spec.flow == FlowSettings(4, 0.5, 1.5)
    assert spec.quant_recipe == QuantRecipe("int4", 64, head=True)
    assert (spec.options.torch_dtype.itemsize, spec.options.tt_mode, spec.options.quant) == (
        2,
        "golden",
        spec.quant_recipe,
    )
    assert spec.options.precision == "bfloat16+int4-g64+head"
    # the dict form: every key, as YAML writes and reads it
    data = spec.to_dict()
    assert tuple(data) == SPEC_KEYS
    assert ModelSpec.from_dict(yaml.safe_load(yaml.safe_dump(data))) == spec
    # the node YAML's `model:` section is the spec plus the request's keys
    node = NodeConfig.from_dict({"model": {**data, "route": "left", "num_samples": 2}})
    assert node.model.spec == spec and node.model.route == "left"
    # no flag: the spec's defaults
    assert model_spec(parser.parse_args(["--checkpoint", "ckpt"])) == ModelSpec(checkpoint="ckpt")


def test_paths_are_kept_as_text(tmp_path):
    spec = ModelSpec(checkpoint=tmp_path, quant_cache=tmp_path / "packed")
    assert spec.checkpoint == str(tmp_path) and spec.quant_cache == str(tmp_path / "packed")
    assert ModelSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"backend": "cuda"}, "model.backend = 'cuda' is invalid; allowed: torch, ttnn"),
        ({"dtype": "float16"}, "model.dtype = 'float16' is invalid; allowed: float32, bfloat16"),
        ({"tt_mode": "card"}, "model.tt_mode = 'card' is invalid; allowed: null, device, golden"),
        ({"recipe": "fastest"}, "model.recipe = 'fastest' is invalid; allowed: accuracy, performance or an"),
        ({"quant": "fp8"}, "model.quant = 'fp8' is invalid; allowed: none, int8, int4"),
        ({"quant": "int4", "quant_group": 48}, "model.quant_group = 48 is invalid; allowed: 32, 64, 128"),
        (
            {"backend": "ttnn", "quant": "int8"},
            "model.quant = 'int8' is invalid; allowed: none with backend ttnn",
        ),
        ({"temperature": 11.0}, "model.temperature = 11.0 is invalid; allowed: 0 (greedy) .. 10"),
        ({"top_p": 0.0}, "model.top_p = 0.0 is invalid; allowed: (0, 1]"),
        ({"top_k": 0}, "model.top_k = 0 is invalid; allowed: >= 1"),
        ({"decoder": "diffusion"}, "model.decoder = 'diffusion' is invalid; allowed: expert, tokens, null"),
        (
            {"draft": "eagle"},
            "model.draft = 'eagle' is invalid; allowed: none, lookup, previous or dflash:DIR",
        ),
        ({"flow_steps": 2000}, "model.flow_steps = 2000 is invalid; allowed: 1..1000"),
        ({"flow_steps": 0}, "flow steps must be an integer >= 1, got 0"),
        ({"flow_temperature": 20.0}, "model.flow_temperature = 20.0 is invalid; allowed: (0, 10]"),
        ({"nav_guidance": "strong"}, "model.nav_guidance = 'strong' is invalid; allowed: a finite number"),
        ({"max_reasoning_tokens": 0}, "model.max_reasoning_tokens = 0 is invalid; allowed: 1..4096"),
    ],
)
def test_bad_values_are_refused_by_key(values, message):
    with pytest.raises(ValueError) as info:
        ModelSpec(checkpoint="ckpt", **values)
    assert message in str(info.value)


def test_the_dict_form_refuses_unknown_keys_and_wrong_types():
    with pytest.raises(ConfigError, match=r"unknown key\(s\) model.flow; allowed: checkpoint, base_model"):
        ModelSpec.from_dict({"flow": {"steps": 3}})
    with pytest.raises(ConfigError, match=r"model.max_reasoning_tokens = '8' is invalid; allowed: a int"):
        ModelSpec.from_dict({"max_reasoning_tokens": "8"})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) model.route"):  # the request's, not the model's
        ModelSpec.from_dict({"route": "left"})
    assert ModelSection.from_dict({"route": "left"}, "model.").route == "left"


def test_a_bad_flag_is_named_by_its_flag(capsys):
    assert main(["predict", "--checkpoint", "ckpt", "--frames", "f", "--ego", "e.csv", "--top-k", "0"]) == 2
    assert "--top-k = 0 is invalid; allowed: >= 1, or null for all tokens" in capsys.readouterr().err
    assert main(["serve", "--recipe", "fastest", "--print-config"]) == 2
    assert "model.recipe = 'fastest' is invalid" in capsys.readouterr().err


def test_every_command_that_loads_a_model_takes_the_same_model_flags():
    spec_flags = set(LOAD_FLAGS) | set(DECODING_FLAGS)
    assert {f[2:].replace("-", "_") for f in spec_flags} == set(SPEC_KEYS)
    for command in RUNTIME_COMMANDS:
        assert spec_flags <= options(command), command
    generate = options("generate")
    assert set(LOAD_FLAGS) <= generate and not set(DECODING_FLAGS) & generate


def test_serve_flags_override_the_node_yaml_key_by_key(tmp_path, capsys):
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"model": {"max_reasoning_tokens": 32, "draft": "previous", "top_k": 5}}))
    argv = ["serve", "--config", str(path), "--draft", "lookup", "--quant", "int8", "--reproducible"]
    assert main([*argv, "--print-config"]) == 0
    model = yaml.safe_load(capsys.readouterr().out)["model"]
    assert (model["max_reasoning_tokens"], model["top_k"]) == (32, 5)  # the file's, no flag given
    assert (model["draft"], model["quant"], model["reproducible"]) == ("lookup", "int8", True)

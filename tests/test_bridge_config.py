"""The node's YAML config: defaults, file, overrides, errors naming the key, value and allowed range."""

from __future__ import annotations

import pytest
import yaml

from alpamayo.cli import main
from alpamayo.errors import ConfigError
from bridges.node.config import DEFAULT_CAMERAS, NodeConfig, load_node_config


def test_defaults_are_a_complete_config():
    cfg = NodeConfig()
    assert cfg.cameras == DEFAULT_CAMERAS
    assert cfg.timing.rate_hz == 10.0 and cfg.input.bind and cfg.curve is None
    assert NodeConfig.from_dict(cfg.to_dict()) == cfg


def test_file_then_overrides(tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "cameras": {"front": 1, "left": 0},
                "timing": {"stale_after_ms": 400},
                "input": {"endpoints": ["tcp://10.0.0.2:5555", "tcp://10.0.0.3:5555"], "bind": False},
                "model": {"reproducible": True},
            }
        )
    )
    cfg = load_node_config(
        path, ["timing.stale_after_ms=250", "model.route=turn left", ("limits.max_width", 1920)]
    )
    assert cfg.cameras == {"front": 1, "left": 0}
    assert cfg.timing.stale_after_ms == 250.0
    assert cfg.model.route == "turn left" and cfg.model.reproducible is True
    assert cfg.limits.max_width == 1920
    assert cfg.input.endpoints == ["tcp://10.0.0.2:5555", "tcp://10.0.0.3:5555"]
    assert cfg.timing.rate_hz == 10.0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"timing": {"stale_after_ms": -1}}, "timing.stale_after_ms = -1.0 is invalid; allowed: > 0"),
        (
            {"timing": {"sync_tolerance_ms": 80}},
            "timing.sync_tolerance_ms = 80.0 is invalid; allowed: (0, 50]",
        ),
        ({"timing": {"rate_hz": "fast"}}, "timing.rate_hz = 'fast' is invalid; allowed: a number"),
        ({"cameras": {"a": 0, "b": 0}}, "allowed: distinct indices"),
        ({"cameras": {"a": 16}}, "cameras.a = 16 is invalid; allowed: 0..15"),
        ({"input": {"endpoints": ["localhost:5555"]}}, "input.endpoints[0] = 'localhost:5555' is invalid"),
        ({"input": {"endpoints": ["tcp://*:1", "tcp://*:2"]}}, "allowed: one when binding"),
        ({"input": {"bind": "yes"}}, "input.bind = 'yes' is invalid; allowed: a bool"),
        ({"timing": {"stale_ms": 5}}, "unknown key(s) timing.stale_ms; allowed: rate_hz"),
        ({"curve": {"server_secret_key": "x"}}, "missing key(s) curve.authorized_keys"),
        ({"model": {"num_samples": 0}}, "model.num_samples = 0 is invalid; allowed: 1..64"),
        ({"limits": {"ring_frames": 2}}, "limits.ring_frames = 2 is invalid; allowed: 4..256"),
        (
            {"model": {"recipe": "fastest"}},
            "model.recipe = 'fastest' is invalid; allowed: accuracy, performance or an existing recipe YAML",
        ),
        ({"model": {"tt_mode": "card"}}, "model.tt_mode = 'card' is invalid; allowed: null, device, golden"),
    ],
)
def test_invalid_values_name_key_value_and_range(data, message):
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_dict(data)
    assert message in str(info.value)


def test_curve_needs_existing_keys_and_tcp(tmp_path):
    (tmp_path / "node.key_secret").write_text("")
    (tmp_path / "clients").mkdir()
    curve = {
        "server_secret_key": str(tmp_path / "node.key_secret"),
        "authorized_keys": str(tmp_path / "clients"),
    }
    assert NodeConfig.from_dict({"curve": curve}).curve.authorized_keys == str(tmp_path / "clients")
    with pytest.raises(
        ConfigError, match="curve = 'ipc:///tmp/in' is invalid; allowed: tcp:// endpoints only"
    ):
        NodeConfig.from_dict({"curve": curve, "input": {"endpoints": ["ipc:///tmp/in"]}})
    with pytest.raises(ConfigError, match=r"curve.server_secret_key = '.*missing' is invalid"):
        NodeConfig.from_dict({"curve": {**curve, "server_secret_key": str(tmp_path / "missing")}})


def test_bad_files_and_overrides_are_reported(tmp_path):
    path = tmp_path / "node.yaml"
    path.write_text("timing: [1, 2")
    with pytest.raises(ConfigError, match=r"node\.yaml: not valid YAML"):
        load_node_config(path)
    path.write_text("- 1\n")
    with pytest.raises(ConfigError, match="node config must be a YAML mapping, got list"):
        load_node_config(path)
    with pytest.raises(ConfigError, match="cannot read node config"):
        load_node_config(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match=r"override = 'timing\.rate_hz' is invalid; allowed: KEY=VALUE"):
        load_node_config(None, ["timing.rate_hz"])


def test_serve_prints_the_effective_config(tmp_path, capsys):
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"timing": {"stale_after_ms": 300}}))
    argv = ["serve", "--config", str(path), "--set", "warmup.runs=0", "--output", "tcp://127.0.0.1:7000"]
    assert main([*argv, "--print-config"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# effective node config\n")
    printed = yaml.safe_load(out)
    assert printed["timing"]["stale_after_ms"] == 300.0
    assert printed["warmup"]["runs"] == 0
    assert printed["output"]["endpoint"] == "tcp://127.0.0.1:7000"
    assert NodeConfig.from_dict(printed) == load_node_config(path, ["warmup.runs=0"]).replace(
        [("output.endpoint", "tcp://127.0.0.1:7000")]
    )


def test_serve_takes_the_ttnn_settings(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("base: accuracy\n")
    argv = ["serve", "--backend", "ttnn", "--recipe", str(recipe), "--set", f"model.tt_cache={tmp_path}"]
    assert main([*argv, "--print-config"]) == 0
    model = yaml.safe_load(capsys.readouterr().out)["model"]
    assert (model["backend"], model["recipe"], model["tt_cache"]) == ("ttnn", str(recipe), str(tmp_path))
    assert model["moe_config"] is None


def test_navigation_guidance_takes_a_weight_or_the_checkpoints(capsys):
    """`model.nav_guidance`: a number, `checkpoint` (the checkpoint's inference_guidance_weight) or null;
    `serve --nav-guidance` without a value asks for the checkpoint's."""
    route = {"route": "Turn right in 30m"}
    assert NodeConfig.from_dict({"model": {**route, "nav_guidance": 2}}).model.nav_guidance == 2.0
    assert (
        NodeConfig.from_dict({"model": {**route, "nav_guidance": "checkpoint"}}).model.nav_guidance
        == "checkpoint"
    )
    for bad in ("strong", float("nan")):
        with pytest.raises(
            ConfigError, match=r"model.nav_guidance = .* is invalid; allowed: a finite number, "
        ):
            NodeConfig.from_dict({"model": {**route, "nav_guidance": bad}})
    with pytest.raises(ConfigError, match=r"model.nav_guidance = \[1\] is invalid; allowed: a number"):
        NodeConfig.from_dict({"model": {**route, "nav_guidance": [1]}})
    argv = ["serve", "--set", "model.route=left", "--print-config"]
    assert main([*argv, "--nav-guidance"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["model"]["nav_guidance"] == "checkpoint"
    assert main([*argv, "--nav-guidance", "1.5"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["model"]["nav_guidance"] == 1.5


def test_serve_without_a_checkpoint_is_a_clear_error(capsys):
    assert main(["serve", "--set", "warmup.runs=0"]) == 2
    assert "no checkpoint: pass --checkpoint DIR" in capsys.readouterr().err

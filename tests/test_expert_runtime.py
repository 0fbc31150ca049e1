"""The action expert as the runtime's trajectory decoder: the default on checkpoints with expert weights, the
choice `--decoder expert|tokens`, its options and records (Prediction, node message, trace), bad input, and
`alpamayo plan`'s DRAM count of the expert."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from alpamayo.config.builtin import CONFIG_DIR
from alpamayo.config.expert import RELEASE_10B_EXPERT, expert_config_of
from alpamayo.config.flow import FlowSettings
from alpamayo.config.loader import load_model_config
from alpamayo.config.model import parse_config
from alpamayo.demo_release import make_demo_checkpoint
from alpamayo.expert.decoding import ExpertDecoder, choose_decoder
from alpamayo.model_spec import ModelSpec
from alpamayo.plan.dram import plan_memory
from alpamayo.plan.precision import PRESETS
from alpamayo.prediction import EgoHistory
from alpamayo.runtime import AlpamayoVLA
from bridges.wire.protocol import TRAJECTORY_VERSION, TrajectoryMessage, decode_trajectory, encode_trajectory

REASONING_CAP = 6


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The Alpamayo 1.5 demo layout (with its tiny expert), loaded once with the expert as decoder."""
    path = make_demo_checkpoint(tmp_path_factory.mktemp("r15") / "ckpt", 0, layout="alpamayo1.5")
    return path, AlpamayoVLA.from_spec(ModelSpec(checkpoint=path, max_reasoning_tokens=REASONING_CAP))


def inputs():
    t = 0.1 * np.arange(16)
    ego = EgoHistory(
        np.stack([8 * t, 0.2 * t, 0 * t], -1), np.tile([0, 0, 0, 1.0], (16, 1)), np.arange(16) * 100_000_000
    )
    rng = np.random.default_rng(0)
    frames = {1: [rng.integers(0, 255, (64, 96, 3), dtype=np.uint8) for _ in range(4)]}
    return frames, ego


def test_expert_is_the_default_decoder_and_is_recorded(release):
    _, vla = release
    frames, ego = inputs()
    assert vla.decoder == "expert" and "action expert (10 flow steps" in vla.model_line()
    mark = len(vla.tracer.spans)
    pred = vla.predict(frames, ego, route="turn left", num_samples=2, seed=3)
    assert pred.decoder == "expert" and pred.flow == {"steps": 10, "temperature": 1.0, "guidance": None}
    for s in pred.samples:
        assert s.token_ids == [] and s.xyz.shape == (64, 3) and np.isfinite(s.xyz).all()
    spans = [s.name for s in vla.tracer.spans[mark:]]
    assert (
        spans.count("expert") == 1 and spans.count("expert_step") == 10 and "trajectory_decode" not in spans
    )
    assert "expert" in pred.timings_ms
    # generation stopped once <|traj_future_start|> was in the cache: cache = prompt + longest reasoning + 1
    (prompt,) = [s.args["tokens"] for s in vla.tracer.spans[mark:] if s.name == "prefill"]
    longest = max(len(s.reasoning_token_ids) for s in pred.samples)
    assert vla.vlm.text.cache_len == prompt + longest + 1
    # the node's output message carries the decoder (trajectory message version 2)
    msg = TrajectoryMessage(0, 1, True, [], decoder=pred.decoder, token_ids=pred.best.token_ids)
    back = decode_trajectory(encode_trajectory(msg))
    assert back.decoder == "expert" and msg.to_dict()["v"] == TRAJECTORY_VERSION == 2


def test_explicit_noise_reproduces_and_steers_the_trajectory(release):
    _, vla = release
    frames, ego = inputs()
    noise = torch.randn(1, 64, 2, generator=torch.Generator().manual_seed(1)).numpy()
    a = vla.predict(frames, ego, seed=5, noise=noise)
    b = vla.predict(frames, ego, seed=5, noise=noise)
    c = vla.predict(frames, ego, seed=5, noise=2 * noise)
    assert np.array_equal(a.best.xyz, b.best.xyz)
    assert np.abs(a.best.xyz - c.best.xyz).max() > 1e-3


def test_bad_expert_inputs_are_clear_errors(release):
    _, vla = release
    frames, ego = inputs()
    bad = np.zeros((1, 64, 2))
    bad[0, 3, 1] = np.nan
    with pytest.raises(ValueError, match=r"initial noise must be finite; element \[0, 3, 1\] is nan"):
        vla.predict(frames, ego, noise=bad)
    with pytest.raises(ValueError, match=r"initial noise must have shape \[2, 64, 2\].*got \[1, 64, 2\]"):
        vla.predict(frames, ego, num_samples=2, seed=1, noise=np.zeros((1, 64, 2)))
    with pytest.raises(ValueError, match="flow steps must be an integer >= 1, got 0"):
        FlowSettings(steps=0)


def test_guidance_and_tokens_decoder_on_the_same_checkpoint(release):
    path, _ = release
    frames, ego = inputs()
    guided = AlpamayoVLA.from_spec(
        ModelSpec(checkpoint=path, max_reasoning_tokens=REASONING_CAP, flow_steps=3, nav_guidance=1.5)
    )
    with pytest.raises(ValueError, match="navigation guidance needs a route"):
        guided.predict(frames, ego, seed=0)
    pred = guided.predict(frames, ego, route="turn left", seed=0)
    assert pred.flow == {"steps": 3, "temperature": 1.0, "guidance": 1.5}
    tokens = AlpamayoVLA.from_spec(
        ModelSpec(checkpoint=path, max_reasoning_tokens=REASONING_CAP, decoder="tokens")
    )
    pred = tokens.predict(frames, ego, seed=0)
    assert tokens.decoder == pred.decoder == "tokens" and pred.flow is None
    assert len(pred.best.token_ids) == 128
    with pytest.raises(ValueError, match="an initial noise is the action expert's input"):
        tokens.predict(frames, ego, noise=np.zeros((1, 64, 2)))


def test_nav_guidance_flag_without_a_weight_takes_the_checkpoints(release):
    """`--nav-guidance` alone: the checkpoint's diffusion_cfg.inference_guidance_weight (the demo's: NVIDIA's
    default 1.0), recorded resolved; a weight that is not a number is refused by argparse, naming it."""
    import argparse

    from alpamayo.commands.common import add_model_args, model_spec

    parser = argparse.ArgumentParser()
    add_model_args(parser, checkpoint_required=False)
    path, _ = release
    flags = ["--checkpoint", str(path), "--max-reasoning-tokens", str(REASONING_CAP)]
    spec = model_spec(parser.parse_args([*flags, "--nav-guidance", "--flow-steps", "3"]))
    assert spec.flow.guidance == "checkpoint"
    assert model_spec(parser.parse_args(["--nav-guidance", "2"])).flow.guidance == 2.0
    with pytest.raises(SystemExit):
        parser.parse_args(["--nav-guidance", "strong"])
    guided = AlpamayoVLA.from_spec(spec)
    assert "navigation guidance 1" in guided.model_line()
    frames, ego = inputs()
    assert guided.predict(frames, ego, route="turn left", seed=0).flow == {
        "steps": 3,
        "temperature": 1.0,
        "guidance": 1.0,
    }


def test_guidance_on_ttnn_is_refused_by_name_before_anything_loads(tmp_path):
    """The device expert reads one cache; navigation guidance (1.5's or Super's) is refused before the VLM or
    the expert is loaded."""
    path = make_demo_checkpoint(tmp_path / "super", 0, layout="super")
    with pytest.raises(
        ValueError, match=r"navigation guidance \(--nav-guidance\) is not implemented on --backend ttnn"
    ):
        AlpamayoVLA.from_spec(ModelSpec(checkpoint=path, backend="ttnn", nav_guidance="checkpoint"))


class WithoutGuidance(ExpertDecoder):
    """The torch decoder declaring, as the ttnn one does, that it cannot build the unguided branch."""

    unguided = None


def test_guidance_is_refused_by_a_decoder_that_declares_no_unguided_branch(release):
    _, vla = release
    frames, ego = inputs()
    settings = FlowSettings(steps=3, guidance=1.5)
    decoder = WithoutGuidance(vla.expert.expert, settings)
    guided = AlpamayoVLA(vla.vlm, vla.planner, max_reasoning_tokens=REASONING_CAP, expert=decoder)
    with pytest.raises(ValueError, match=r"trajectory decoder \(WithoutGuidance\) has no unguided branch"):
        guided.predict(frames, ego, route="turn left", seed=0)
    assert ExpertDecoder(vla.expert.expert, settings).unguided is not None


def test_decoder_choice_rules():
    cfg = object()
    assert choose_decoder(None, cfg, True, "c") == "expert"  # either backend (ttnn: alpamayo.tt.expert)
    assert choose_decoder(None, None, False, "c") == "tokens"
    assert choose_decoder("tokens", cfg, True, "c") == "tokens"
    with pytest.raises(ValueError, match=r"--decoder expert: c: its config\.json describes no action expert"):
        choose_decoder("expert", None, False, "c")
    with pytest.raises(ValueError, match="--decoder expert: c: it holds no expert tensors"):
        choose_decoder("expert", cfg, False, "c")


def test_the_demo_layout_carries_the_expert_under_the_1_5_names(demo_checkpoint, release):
    """The project's layout writes Alpamayo 1.5's flat expert fields and tensor names, so it decodes with the
    expert by default and parses to the same expert as the 1.5 layout of the same seed."""
    raw = json.loads((demo_checkpoint / "config.json").read_text())
    assert {"expert_cfg", "action_in_proj_cfg", "action_out_proj_cfg", "diffusion_cfg"} <= set(raw)
    demo_cfg = expert_config_of(load_model_config(demo_checkpoint))
    release_cfg = expert_config_of(load_model_config(release[0]))
    assert (demo_cfg.layout, demo_cfg.prefixes) == (release_cfg.layout, release_cfg.prefixes)
    assert (demo_cfg.text, demo_cfg.in_proj) == (release_cfg.text, release_cfg.in_proj)
    assert demo_cfg.num_inference_steps == 10 and demo_cfg.out_proj_bias
    with safe_open(demo_checkpoint / "model.safetensors", "pt") as f:
        names = f.keys()  # safetensors' own reader: the names on disk
    demo_names = {k for k in names if not k.startswith("vlm.")}
    index = json.loads((release[0] / "model.safetensors.index.json").read_text())
    assert demo_names == {k for k in index["weight_map"] if not k.startswith("vlm.")}
    assert demo_names == set(demo_cfg.weight_shapes())
    vla = AlpamayoVLA.from_spec(ModelSpec(checkpoint=demo_checkpoint, max_reasoning_tokens=2))
    assert vla.decoder == "expert" and "action expert (10 flow steps" in vla.model_line()


def _copy_checkpoint(src, dst, config=None, weights=None):
    """`src` in `dst` (links to its files), with `config` (a dict) / `weights` (tensors) written instead."""
    dst.mkdir()
    for f in src.iterdir():
        if not (f.name == "config.json" and config is not None) and not (
            f.name == "model.safetensors" and weights is not None
        ):
            (dst / f.name).symlink_to(f)
    if config is not None:
        (dst / "config.json").write_text(json.dumps(config))
    if weights is not None:
        save_file(weights, str(dst / "model.safetensors"))
    return dst


def test_decoder_expert_without_expert_config_or_tensors_is_refused(demo_checkpoint, tmp_path):
    raw = json.loads((demo_checkpoint / "config.json").read_text())
    bare = {
        k: v for k, v in raw.items() if not k.startswith(("expert", "action_in", "action_out", "diffusion"))
    }
    no_config = _copy_checkpoint(demo_checkpoint, tmp_path / "no-config", config=bare)
    assert AlpamayoVLA.from_spec(ModelSpec(checkpoint=no_config, max_reasoning_tokens=2)).decoder == "tokens"
    with pytest.raises(ValueError, match="describes no action expert"):
        AlpamayoVLA.from_spec(ModelSpec(checkpoint=no_config, decoder="expert"))
    vlm = {k: v for k, v in load_file(demo_checkpoint / "model.safetensors").items() if k.startswith("vlm.")}
    no_tensors = _copy_checkpoint(demo_checkpoint, tmp_path / "no-tensors", weights=vlm)
    assert AlpamayoVLA.from_spec(ModelSpec(checkpoint=no_tensors, max_reasoning_tokens=2)).decoder == "tokens"
    with pytest.raises(ValueError, match="it holds no expert tensors"):
        AlpamayoVLA.from_spec(ModelSpec(checkpoint=no_tensors, decoder="expert"))


def test_cli_predict_reports_the_expert(release, tmp_path, capsys):
    from PIL import Image

    from alpamayo.cli import main
    from alpamayo.inputs import EGO_COLUMNS

    path, _ = release
    frames, ego = inputs()
    for cam, images in frames.items():
        (tmp_path / "frames" / str(cam)).mkdir(parents=True)
        for i, img in enumerate(images):
            Image.fromarray(img).save(tmp_path / "frames" / str(cam) / f"{i}.png")
    rows = [",".join(EGO_COLUMNS)]
    rows += [
        ",".join(map(str, [int(t), *p, *q])) for t, p, q in zip(ego.t_ns, ego.xyz, ego.quat_xyzw, strict=True)
    ]
    (tmp_path / "ego.csv").write_text("\n".join(rows) + "\n")
    common = [
        "--checkpoint",
        str(path),
        "--frames",
        str(tmp_path / "frames"),
        "--ego",
        str(tmp_path / "ego.csv"),
    ]
    rc = main(
        ["predict", *common, "--max-reasoning-tokens", "4", "--flow-steps", "2", "--seed", "1", "--json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["decoder"] == "expert" and out["flow"]["steps"] == 2
    assert out["samples"][0]["trajectory_token_ids"] == []
    assert main(["predict", *common, "--max-reasoning-tokens", "4", "--flow-steps", "0"]) != 0
    assert "flow steps must be an integer >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("recipe", sorted(PRESETS))
def test_plan_counts_the_release_expert(recipe, record_figure):
    """8B VLM + the released 2.3B expert: the expert's weights are counted like the VLM's layers (its norms and
    biases in the bf16 groups), its K/V region in the cache and its step's trace region (alpamayo.plan.dram)."""
    raw = json.loads((CONFIG_DIR / "qwen3-vl-8b.json").read_text())
    release = {"vlm_config": copy.deepcopy(raw), **RELEASE_10B_EXPERT}
    with_expert, without = parse_config(release), parse_config(raw)
    assert expert_config_of(with_expert) is not None and expert_config_of(without) is None
    plan, base = plan_memory(with_expert, PRESETS[recipe], 8192), plan_memory(without, PRESETS[recipe], 8192)
    expert = plan.weights["expert"]
    record_figure(f"{recipe}: expert DRAM weights (GB)", expert / 1e9)
    # 2.28e9 parameters at bfp4 (0.5625 B) .. bf16 (2 B) per element
    assert 0.5625 * 2.28e9 < expert < 2.0 * 2.29e9
    added = plan.weight_bytes - base.weight_bytes
    assert expert < added < 1.01 * expert  # plus the expert's norms and biases
    # The expert's weights reach the DRAM total, not only the weight table.
    assert plan.total - base.total >= added
    assert 0 < plan.kv_cache - base.kv_cache < 0.02 * base.kv_cache  # 64 rows behind 8192

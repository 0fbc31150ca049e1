"""Alpamayo R1 un-normalises the expert's actions with the action-space statistics its checkpoint stores.

NVIDIA's loading rule (`NVlabs/alpamayo` `src/alpamayo_r1/models/alpamayo_r1.py`): `AlpamayoR1.__init__`
builds `self.action_space` from `config.action_space_cfg`, whose `{accel,curvature}_{mean,std}` are persistent
buffers; `from_pretrained` then loads the checkpoint's stored tensors into them, and `action_to_traj`
un-normalises the sampled actions with those. A bf16 release stores them bf16-rounded (`accel_std` 0.6797
against 0.68104 in config.json). Alpamayo 1.5 registers them `persistent=False`: nothing stored, config wins.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from alpamayo.checkpoint import Checkpoint
from alpamayo.config.expert import expert_config_of
from alpamayo.config.loader import load_model_config
from alpamayo.demo_release import make_demo_checkpoint
from alpamayo.errors import CheckpointError
from alpamayo.expert.weights import ACTION_STATISTICS, stored_action_statistics
from alpamayo.model_spec import ModelSpec
from alpamayo.runtime import AlpamayoVLA
from tests.test_expert_runtime import inputs

REASONING_CAP = 4


def rewrite_statistics(ckpt, edit) -> None:
    """Rewrite the shard holding R1's `action_space.*` buffers with `edit(tensors)` applied."""
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    shard = ckpt / index["weight_map"]["action_space.accel_std"]
    tensors = load_file(shard)
    edit(tensors)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if k in tensors or v != shard.name}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.fixture(scope="module")
def r1_pair(tmp_path_factory):
    """The R1 demo release as written (float32 buffers holding config.json's values) and the same release with
    its buffers stored in bf16, as a bf16 release holds them."""
    root = tmp_path_factory.mktemp("r1")
    f32 = make_demo_checkpoint(root / "r1", seed=0, layout="r1")
    bf16 = root / "r1-bf16"
    shutil.copytree(f32, bf16)
    config = json.loads((bf16 / "config.json").read_text())
    config["vlm_name_or_path"] = str((root / "r1-base").resolve())
    (bf16 / "config.json").write_text(json.dumps(config))

    def to_bf16(tensors):
        for k in ACTION_STATISTICS:
            tensors[f"action_space.{k}"] = tensors[f"action_space.{k}"].to(torch.bfloat16)

    rewrite_statistics(bf16, to_bf16)
    return f32, bf16


def test_the_stored_bf16_statistics_un_normalise_the_experts_actions(r1_pair):
    f32, bf16 = r1_pair
    config = load_model_config(f32).extra["action_space_cfg"]
    stored = {k: float(torch.tensor(config[k]).to(torch.bfloat16)) for k in ACTION_STATISTICS}
    assert stored["accel_std"] != config["accel_std"]  # bf16 rounding moves every statistic
    frames, ego = inputs()
    actions = {}
    for name, path in (("f32", f32), ("bf16", bf16)):
        vla = AlpamayoVLA.from_spec(ModelSpec(checkpoint=path, max_reasoning_tokens=REASONING_CAP))
        try:
            assert vla.decoder == "expert"
            settings = vla.planner.action_space.settings
            want = (
                stored if name == "bf16" else {k: float(torch.tensor(config[k])) for k in ACTION_STATISTICS}
            )
            assert {k: getattr(settings, k) for k in ACTION_STATISTICS} == want
            actions[name] = vla.predict(frames, ego, seed=3).best.actions
        finally:
            vla.close()
    # Same weights, tokens and noise: the expert's normalised output is one array; un-normalised with the
    # stored bf16 numbers it is (a - mean_bf16) / std_bf16 exactly.
    f32_stats = {k: float(torch.tensor(config[k])) for k in ACTION_STATISTICS}

    def normalised(a, s):
        return (a - [s["accel_mean"], s["curvature_mean"]]) / [s["accel_std"], s["curvature_std"]]

    np.testing.assert_allclose(
        normalised(actions["bf16"], stored), normalised(actions["f32"], f32_stats), atol=1e-12
    )
    assert not np.allclose(actions["bf16"], actions["f32"], atol=1e-7, rtol=0)


def test_alpamayo_1_5_stores_none_and_the_config_serves(tmp_path):
    path = make_demo_checkpoint(tmp_path / "r15", seed=0, layout="alpamayo1.5")
    cfg = load_model_config(path)
    assert stored_action_statistics(Checkpoint(path, cfg.weight_prefix), expert_config_of(cfg)) is None


def test_a_partial_or_bad_set_of_stored_statistics_is_refused(r1_pair, tmp_path):
    broken = tmp_path / "r1-broken"
    shutil.copytree(r1_pair[0], broken)
    config = json.loads((broken / "config.json").read_text())
    config["vlm_name_or_path"] = str((r1_pair[0].parent / "r1-base").resolve())
    (broken / "config.json").write_text(json.dumps(config))
    rewrite_statistics(broken, lambda t: t.update({"action_space.accel_std": torch.tensor(0.0)}))
    cfg = load_model_config(broken)
    with pytest.raises(CheckpointError, match=r"action_space\.accel_std = 0\.0; expected a finite value"):
        stored_action_statistics(Checkpoint(broken, cfg.weight_prefix), expert_config_of(cfg))
    rewrite_statistics(broken, lambda t: t.pop("action_space.curvature_std"))
    with pytest.raises(CheckpointError, match=r"are stored but not \['action_space\.curvature_std'\]"):
        stored_action_statistics(
            Checkpoint(broken, load_model_config(broken).weight_prefix), expert_config_of(cfg)
        )

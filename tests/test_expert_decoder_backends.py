"""`alpamayo.backends.load_expert_decoder` on the torch backend: the checkpoint's action expert as the
trajectory decoder over the loaded text model (the ttnn side: tests/test_tt_expert_dryrun.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from alpamayo.backends import TORCH_CPU, load_expert_decoder, load_text_model
from alpamayo.checkpoint import open_checkpoint
from alpamayo.expert.decoding import ExpertDecoder
from planner.plans import GeneratedPlan
from tests.hf_checkpoints import save_checkpoint, text_config
from tests.tt_expert_cases import save_alpamayo_checkpoint


def test_torch_backend_samples_with_the_checkpoints_expert(tmp_path):
    ckpt, cfg = open_checkpoint(save_alpamayo_checkpoint(tmp_path / "alpamayo", seed=2))
    text = load_text_model(ckpt, cfg, TORCH_CPU)
    decoder = load_expert_decoder(ckpt, cfg, TORCH_CPU, text)
    assert isinstance(decoder, ExpertDecoder)
    text.setup_cache(64)
    text.prefill(torch.arange(23) % 200)  # prompt (20), reasoning (2), <|traj_future_start|>
    plan = GeneratedPlan([5, 6], False, np.zeros(0, np.int64), [])
    actions = decoder.sample(decoder.context(text, 20, [plan]), seed=0)
    assert actions.shape == (1, 64, 2) and torch.isfinite(actions).all()


def test_a_checkpoint_without_an_expert_is_refused_naming_it(tmp_path):
    save_checkpoint(tmp_path / "plain", text_config(), seed=0)
    ckpt, cfg = open_checkpoint(tmp_path / "plain")
    with pytest.raises(ValueError, match="the checkpoint has no action expert; use the tokens decoder"):
        load_expert_decoder(ckpt, cfg, TORCH_CPU, None)

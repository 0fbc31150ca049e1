"""The one-chip MoE block on a Blackhole p150 against the torch reference block (marked `blackhole`), and the
same checks at the `accuracy` recipe in the ttnn golden mode (marked `golden`, `alpamayo.tt.golden`).

Every sparse layer of the tiny MoE checkpoint (`TT_TINY["moe"]`: 32 experts, top-4, hidden 128 on a 256-wide
residual stream) runs alone on the device (`tests.tt_text_seams.moe_rows`) and in the torch reference (`SparseMoE` on the
recipe-rounded weights of `QuantizedCheckpoint`, float32) on the same bf16 rows, for both presets:

  * prefill (expert-grouped sparse matmuls, 300 rows): PCC >= 0.99 per layer;
  * decode (top-k sparse matmuls, one token): PCC >= 0.99 for each of 16 tokens per layer; a token whose
    k-th and (k+1)-th routing probabilities are within 2% (`tests.routing.NEAR_TIE`) may pick either expert
    under rounding and is skipped and counted.

With `ALPAMAYO_TT_CHECKPOINT` naming a Qwen3-VL-MoE checkpoint (recipe `ALPAMAYO_TT_RECIPE`), its first two
sparse layers are checked the same way (reference in bfloat16).
"""

from __future__ import annotations

import os

import pytest
import torch

from alpamayo.config.loader import load_model_config
from alpamayo.numerics import assert_agrees
from tests.routing import NEAR_TIE, routing_margin
from tests.tt_checkpoints import REAL_ENV, real_recipe, reference_and_device, save_tt_checkpoint
from tests.tt_modes import case_device, device_cases
from tests.tt_text_seams import moe_rows

LAYER_PCC = 0.99
PREFILL_ROWS, DECODE_TOKENS = 300, 16


@pytest.fixture(scope="module", params=device_cases(["moe-accuracy", "moe-performance", "real"]))
def case(request, tmp_path_factory):
    param, device = case_device(request)
    if param == "real":
        path = os.environ.get(REAL_ENV)
        if not path or load_model_config(path).text.moe is None:
            pytest.skip(f"set {REAL_ENV} to a Qwen3-VL-MoE checkpoint directory to check its MoE layers")
        recipe, dtype = real_recipe(), torch.bfloat16
    else:
        path, recipe, dtype = (
            tmp_path_factory.mktemp(param),
            param.split("-")[1],
            torch.float32,
        )
        save_tt_checkpoint(path, "moe", seed=11)
    ref, tt = reference_and_device(path, recipe, device, dtype)
    layers = sorted(tt.moe)[:2]
    yield ref, tt, layers, dtype
    tt.close()


def _rows(n: int, hidden: int, seed: int) -> torch.Tensor:
    """Normed-residual-like rows, already bf16 (what the device receives)."""
    return torch.randn(n, hidden, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def test_prefill_moe_layers_match_the_reference(case, record_figure):
    ref, tt, layers, dtype = case
    worst, worst_abs = 1.0, 0.0
    for i in layers:
        x = _rows(PREFILL_ROWS, ref.text_cfg.hidden_size, seed=i)
        with torch.inference_mode():
            expected = ref.layers[i].mlp(x.to(dtype))
        got = moe_rows(tt.moe[i], x)
        p = assert_agrees(expected, got, min_pcc=LAYER_PCC, what=f"prefill MoE layer {i}")
        worst, worst_abs = min(worst, p.pcc), max(worst_abs, p.max_abs)
    record_figure(f"prefill MoE layer worst PCC ({PREFILL_ROWS} rows)", worst)
    record_figure("prefill MoE layer worst max abs error", worst_abs)


def test_decode_moe_layers_match_the_reference_token_by_token(case, record_figure):
    ref, tt, layers, dtype = case
    worst, ties, checks = 1.0, 0, 0
    for i in layers:
        block = ref.layers[i].mlp
        for token in range(DECODE_TOKENS):
            x = _rows(1, ref.text_cfg.hidden_size, seed=1000 * i + token)
            with torch.inference_mode():
                margin = float(routing_margin(block.router.proj(x.to(dtype)), block.router.k)[0])
                expected = block(x.to(dtype))
            got = moe_rows(tt.moe[i], x)
            if margin < NEAR_TIE:
                ties += 1
                continue
            what = f"decode MoE layer {i}, token {token} (routing margin {margin:.3f})"
            worst, checks = (
                min(worst, assert_agrees(expected, got, min_pcc=LAYER_PCC, what=what).pcc),
                checks + 1,
            )
    record_figure("decode MoE layer worst PCC", worst)
    record_figure("decode MoE tokens skipped at routing near-ties", f"{ties} of {ties + checks}")
    assert 2 * checks >= ties + checks

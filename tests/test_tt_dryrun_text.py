"""The ttnn text backbone (dense and MoE) through ttnn's host-side checks on the dry run's mock p150 (marked
`dryrun`; see `alpamayo.tt.dryrun`). No numbers are checked: the mock runs no kernels and reads back zeros.

Cases, both recipes each: the tiny device-test checkpoints (`TT_TINY`: GQA 2:1, GQA 8:1 with a tied head, MoE
with 32-wide heads) and the demo checkpoint, uploaded from safetensors as `--backend ttnn` does; and the
published 2B, 8B, 32B and 30B-A3B configs with two layers, their weights allocated uninitialised
(`alpamayo.tt.dryrun.models`). Each runs a 126-token prefill and untraced decode at positions 126..129 (a tile
and a flash-decode chunk boundary) and checks what the plan says: weight placement, KV cache, residual stream
and logits layout. `ttnn.graph` capture of one decode step checks the trace rule (no host <-> device copy
inside the step) and counts the device programs per layer.
"""

from __future__ import annotations

import pytest
import torch

from alpamayo.plan.device_spec import TILE, round_up
from alpamayo.tt.dryrun.graph import Capture
from alpamayo.tt.ttnn_configs import ttnn_dtype
from tests.tt_checkpoints import TT_TINY, save_tt_checkpoint
from tests.tt_text_seams import moe_rows, wrapped_decode_layers

pytestmark = pytest.mark.dryrun

RECIPES = ("accuracy", "performance")
REAL = ("qwen3-vl-2b", "qwen3-vl-8b", "qwen3-vl-32b", "qwen3-vl-30b-a3b")
REAL_LAYERS = 2
CASES = [f"{name}/{recipe}" for name in (*TT_TINY, "demo", *REAL) for recipe in RECIPES]
MOE_CASES = [case for case in CASES if case.split("/")[0] in ("moe", "qwen3-vl-30b-a3b")]
PROMPT_LEN, DECODE_STEPS, MAX_SEQ_LEN = 126, 4, 256


@pytest.fixture(scope="module", params=CASES)
def model(request, dryrun_device, demo_checkpoint, tmp_path_factory):
    from alpamayo.tt.dryrun.models import cut_config, text_model
    from alpamayo.tt.text import TTTextModel

    name, recipe = request.param.split("/")
    if name in REAL:
        tt = text_model(cut_config(name, REAL_LAYERS), recipe, dryrun_device)
    else:
        path = demo_checkpoint if name == "demo" else tmp_path_factory.mktemp(name)
        if name != "demo":
            save_tt_checkpoint(path, name, seed=3)
        tt = TTTextModel.from_checkpoint(path, precision=recipe, device=dryrun_device)
    tt.setup_cache(MAX_SEQ_LEN)
    yield tt
    tt.close()


def prompt(tt) -> torch.Tensor:
    return torch.arange(PROMPT_LEN) % min(tt.text_cfg.vocab_size, 256)


def decode_matmuls(t, banks: int) -> dict[str, tuple[int, int, str]]:
    """The plan of docs/ttnn-text.md stated from the text config alone: each decode matmul weight `[K, N]`
    (name suffix -> padded K, padded N, precision group), DRAM width-sharded with N padded to 32 x banks so each
    bank holds whole tiles; K is the residual stream's padded width where the input is the residual stream, the
    gate/up output's padded width for the down projection, the attention output's own width for `wo`."""
    wide = TILE * banks
    hidden = round_up(t.hidden_size, wide)
    attn = t.num_attention_heads * t.head_dim
    qkv = (t.num_attention_heads + 2 * t.num_key_value_heads) * t.head_dim
    plan = {"wqkv": (hidden, round_up(qkv, wide), "qkv"), "wo": (attn, hidden, "o")}
    if t.moe is None:
        inter = round_up(t.intermediate_size, wide)
        plan |= {
            "w_gate": (hidden, inter, "mlp_gate_up"),
            "w_up": (hidden, inter, "mlp_gate_up"),
            "w_down": (inter, hidden, "mlp_down"),
        }
    return plan


def device_weights(model):
    """(name, tensor) of every device weight of `model`: each layer's matmul weights by `decoder_layer_specs`
    name (`layers.{i}.wqkv`, ...), its other tensors and the head's under names no plan entry ends with."""
    for i, layer in enumerate(model.layers):
        w = layer.weights
        matmuls = {"wqkv": w.wqkv, "wo": w.wo}
        if w.mlp is not None:
            matmuls |= {"w_gate": w.mlp.gate, "w_up": w.mlp.up, "w_down": w.mlp.down}
        yield from ((f"layers.{i}.{name}", t) for name, t in matmuls.items())
        others = [t for t in w.tensors() if all(t is not m for m in matmuls.values())]
        yield from ((f"layers.{i}.tensor{j}", t) for j, t in enumerate(others))
    yield from ((f"head.tensor{j}", t) for j, t in enumerate(model.head.tensors()))


def test_weights_and_kv_cache_are_placed_as_planned(model):
    """Every device weight against the plan restated from the config (not the loader's own `placement()`):
    the decode matmuls DRAM width-sharded over every bank, [K, N / banks] per bank, in their group's dtype;
    everything else interleaved in DRAM; the K/V cache one DRAM tensor per layer, K and V each."""
    ttnn, banks, t = model.ttnn, model.plan.device.dram_banks, model.text_cfg
    plan = decode_matmuls(t, banks)
    sharded = []
    for name, w in device_weights(model):
        config = w.memory_config()
        assert config.buffer_type == ttnn.BufferType.DRAM, name
        suffix = name.rsplit(".", 1)[-1]
        if name.startswith("layers.") and suffix in plan:
            k, n, group = plan[suffix]
            assert tuple(w.shape) == (k, n), name
            assert config.memory_layout == ttnn.TensorMemoryLayout.WIDTH_SHARDED, name
            assert tuple(config.shard_spec.shape) == (k, n // banks), name
            assert config.shard_spec.grid.num_cores() == banks, name
            assert w.dtype == ttnn_dtype(ttnn, model.precision.dtype(group)), name
            sharded.append(name)
        else:
            assert config == ttnn.DRAM_MEMORY_CONFIG, name
    assert len(sharded) == t.num_hidden_layers * len(plan)
    head = model.head.lm_head
    assert tuple(head.shape) == (round_up(t.hidden_size, TILE * banks), round_up(t.vocab_size, TILE))
    assert len(model.kv_cache) == t.num_hidden_layers
    for k, v in model.kv_cache:
        for c in (k, v):
            assert tuple(c.shape) == (
                1,
                t.num_key_value_heads,
                model.plan.cache_length(MAX_SEQ_LEN),
                t.head_dim,
            )
            assert c.dtype == model.kernels.kv_dtype and c.memory_config() == ttnn.DRAM_MEMORY_CONFIG


def test_prefill_and_decode_across_a_tile_and_a_flash_decode_chunk(model, capsys):
    from alpamayo.tt.text import DRY_RUN_NOTICE

    ttnn, t = model.ttnn, model.text_cfg
    seen = []

    def recorded(layer):
        def run(i, x, *args):
            out = layer(i, x, *args)
            seen.append((i, tuple(out.shape), out.dtype, out.memory_config()))
            return out

        return run

    with wrapped_decode_layers(model, recorded):
        logits = model.prefill(prompt(model))
        assert logits.shape == (t.vocab_size,) and logits.dtype == torch.float32
        for step in range(DECODE_STEPS):
            logits = model.decode(step + 1)  # traced by default: untraced under the dry run, with a notice
            assert logits.shape == (t.vocab_size,) and logits.dtype == torch.float32
    assert model.cache_len == PROMPT_LEN + DECODE_STEPS
    residual = (1, 1, 32, model.plan.hidden_padded)
    assert seen == [
        (i, residual, ttnn.bfloat16, model.decoder.programs.res_mem)
        for _ in range(DECODE_STEPS)
        for i in range(t.num_hidden_layers)
    ]
    assert model.decoder.programs.res_mem.shard_spec.grid.num_cores() == model.plan.residual_grid.cores
    assert capsys.readouterr().err.count(DRY_RUN_NOTICE) == 1


def test_a_prefill_block_scores_its_drafted_rows_across_a_tile_and_the_padding(model):
    """A first speculative block verified in the prefill: 126 prompt rows and 4 drafted ones (130 rows, padded
    to 256) score rows 125..129, which lie in two tiles: two lm_head passes, one row each tile it needs."""
    t = model.text_cfg
    logits = model.prefill_block(prompt(model), drafted=[5, 6, 7, 8])
    assert logits.shape == (5, t.vocab_size) and logits.dtype == torch.float32
    assert model.cache_len == PROMPT_LEN + 4
    model.fork(1)
    model.rollback([PROMPT_LEN + 1])  # the row kept one drafted token
    assert model.decode(1).shape == (t.vocab_size,)
    assert model.prefill_block(prompt(model)).shape == (1, t.vocab_size)


def test_a_decode_step_copies_nothing_between_host_and_device(model, record_figure):
    ttnn, t = model.ttnn, model.text_cfg
    model.prefill(prompt(model))
    inputs = model.decoder.write_inputs(
        model.decoder.host_inputs([1], [model.cache_len])
    )  # before the step, as a replay
    with Capture(ttnn) as step:
        row = model.decoder.graph(model.cache, inputs)
    assert step.host_transfers() == []
    assert tuple(row.shape) == (1, 1, 1, model.plan.head.n_padded)
    assert row.layout == ttnn.ROW_MAJOR_LAYOUT and row.dtype == ttnn.bfloat16
    assert row.memory_config() == ttnn.DRAM_MEMORY_CONFIG
    model.kernels.free(row)
    x, cos, sin = model.decoder.programs.sharded_inputs(inputs)
    per_layer = []
    for i in range(t.num_hidden_layers):
        with Capture(ttnn) as layer:
            x = model.layers[i].decode(x, cos, sin, model.kv_cache[i], inputs)
        assert layer.host_transfers() == []
        per_layer.append(layer.programs())
    model.kernels.free(x, cos, sin)
    assert sum(per_layer) < step.programs()  # the step is the layers, the final norm and the head
    kinds = {"MoE" if i in model.moe else "dense": n for i, n in enumerate(per_layer)}
    for kind, n in kinds.items():
        record_figure(f"decode device programs per {kind} layer", n)
    record_figure("decode device programs per step", step.programs())


@pytest.mark.parametrize("model", MOE_CASES, indirect=True)
def test_moe_block_runs_its_decode_and_grouped_prefill_paths(model):
    assert model.moe
    ttnn, hidden = model.ttnn, model.text_cfg.hidden_size
    block = model.moe[min(model.moe)]
    for rows in (1, 33, 300):  # decode path (one row), grouped prefill (padded to 128 and to 384 rows)
        out = moe_rows(block, torch.randn(rows, hidden))
        assert out.shape == (rows, hidden) and out.dtype == torch.bfloat16
    x = model.kernels.upload_rows(torch.randn(1, hidden), 32, model.plan.hidden_padded, ttnn.L1_MEMORY_CONFIG)
    with Capture(ttnn) as decode:
        out = block.decode(x)
    assert decode.host_transfers() == []  # the MoE decode runs inside the traced step
    assert tuple(out.shape) == (1, 1, 32, model.plan.hidden_padded)
    model.kernels.free(x, out)

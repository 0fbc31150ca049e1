"""A few-row forward on CPU (`alpamayo.text.threads`): its element-wise ops on one thread, its matmuls and
attention on every thread, and a verify of 8 tokens whose element-wise ops cross torch's parallel grain
bitwise equal to the same verify with every op on the whole pool."""

from __future__ import annotations

import json

import pytest
import torch

import alpamayo.text.threads as threads
from alpamayo.config.builtin import CONFIG_DIR
from alpamayo.config.model import parse_config
from alpamayo.demo_checkpoint import random_weights
from alpamayo.text import TextModel
from alpamayo.text.weights import text_tensor_shapes

pool = pytest.mark.skipif(torch.get_num_threads() == 1, reason="one intra-op thread: nothing to switch")


@pool
def test_few_rows_gives_matmuls_every_thread_and_the_rest_one():
    n, cpu = torch.get_num_threads(), torch.device("cpu")
    with threads.few_rows(8, cpu):
        assert torch.get_num_threads() == 1
        with threads.wide():
            assert torch.get_num_threads() == n
        assert torch.get_num_threads() == 1
        with threads.few_rows(2, cpu):  # nested: the outer one rules
            assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == n
    for rows in (1, threads.SERIAL_ROWS + 1):
        with threads.few_rows(rows, cpu):
            assert torch.get_num_threads() == n
    with threads.wide():
        assert torch.get_num_threads() == n
    with pytest.raises(RuntimeError), threads.few_rows(8, cpu):
        raise RuntimeError("the thread count is restored on the way out")
    assert torch.get_num_threads() == n


def wide_mlp_model() -> TextModel:
    """One Qwen3-VL layer (8B heads) with an 8192-wide MLP: a verify of 8 tokens runs [8, 8192] SiLU products
    (65536 elements, past torch's 32768-element grain, so parallel on the whole pool)."""
    raw = json.loads((CONFIG_DIR / "qwen3-vl-8b.json").read_text())
    raw["text_config"].update(num_hidden_layers=1, hidden_size=1024, intermediate_size=8192, vocab_size=4096)
    raw["text_config"].update(num_attention_heads=8, num_key_value_heads=2)
    raw["vision_config"]["out_hidden_size"] = 1024
    cfg = parse_config(raw, "qwen3-vl-8b.json (cut)")
    return TextModel.from_weights(cfg, random_weights(text_tensor_shapes(cfg), seed=0))


@pool
def test_a_few_row_verify_is_bitwise_the_verify_on_the_whole_pool(monkeypatch):
    model = wide_mlp_model()
    model.setup_cache(96, 1)
    model.prefill(torch.arange(64) % 4096)
    block = torch.arange(100, 108)[None]
    one_thread = model.verify(block)
    model.rollback([64])
    monkeypatch.setattr(threads, "SERIAL_ROWS", 0)  # every op on the whole pool
    pooled = model.verify(block)
    assert torch.equal(one_thread, pooled)

"""Test access to one layer of a `TTTextModel` (or one MoE block) at a time (per-layer PCC on a card, op checks
on the dry run).

These drive the model's own layer code with a reference's inputs; they are not part of the product.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from alpamayo.plan.device_spec import TILE
from alpamayo.plan.programs.text import TextPlan
from alpamayo.text.inputs import check_prefill, rope_delta

# layer(i, x, cos, sin, kv, inputs) -> x: layer i's `DecoderLayer.decode`
DecodeLayer = Callable[..., Any]


def layer_prefill(tt: Any, i: int, hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Decoder layer `i` alone on hidden [L, H] at position_ids [3, L] -> [L, H] bf16. Writes K/V rows
    [0, Lp) of layer i and sets the decode position state as a prefill would."""
    cache, kern = tt._require_cache(), tt.kernels
    length = hidden.shape[0]
    position_ids = check_prefill(tt.text_cfg, length, tt.max_seq_len, position_ids, None, None)
    padded = tt.plan.padded_length(length)
    cos, sin = tt.prefiller.rope_tables(position_ids, padded)
    h = kern.upload_rows(hidden, padded, kern.hidden_padded)
    out = tt.layers[i].prefill(h, cos, sin, cache.layers[i], length)
    result = kern.download(out)[0, 0, :length, : tt.text_cfg.hidden_size]
    kern.free(out, cos, sin)
    tt.cache_len, tt.rope_delta = length, rope_delta(position_ids)
    return result


def layer_decode(tt: Any, i: int, hidden: torch.Tensor, position: int) -> torch.Tensor:
    """Decoder layer `i` alone on hidden [H] at cache index `position` (untraced) -> [H] bf16. Writes K/V row
    `position` of layer i; the rope position is `position + rope_delta`."""
    cache, kern = tt._require_cache(), tt.kernels
    if not 0 <= position < tt.max_seq_len:
        raise ValueError(f"position {position} must be in [0, max_seq_len={tt.max_seq_len})")
    t = tt.text_cfg
    values = tt.decoder.host_inputs([0], [position])
    values.x[0, 0, 0, : t.hidden_size] = hidden.to(torch.bfloat16)
    inputs = tt.decoder.write_inputs(values)
    x, cos, sin = tt.decoder.programs.sharded_inputs(inputs)
    out = tt.layers[i].decode(x, cos, sin, cache.layers[i], inputs)
    result = kern.download(out)[0, 0, 0, : t.hidden_size]
    kern.free(out, cos, sin)
    return result


def moe_rows(block: Any, x: torch.Tensor) -> torch.Tensor:
    """A `TTMoE` block alone on host rows x [T, H] -> [T, H] bf16 (layer PCC). One row runs the traced decode
    path (row 0 of a tile in L1), more rows the grouped prefill path (padded to a multiple of 128)."""
    ttnn = block.ttnn
    tokens, hidden = x.shape
    rows = TILE if tokens == 1 else TextPlan.padded_length(tokens)
    memory = ttnn.L1_MEMORY_CONFIG if tokens == 1 else ttnn.DRAM_MEMORY_CONFIG
    dev = block.upload_rows(x, rows, block.plan.hidden_padded, memory)
    out = block.decode(dev) if tokens == 1 else block.prefill(dev, tokens)
    result = block.download(out)[0, 0, :tokens, :hidden]
    block.free(dev, out)
    return result


def kv_cache_host(tt: Any, i: int, length: int, row: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of layer i, cache row `row`, positions [0, length): [n_kv, length, head_dim] float32 each."""
    return tuple(tt.kernels.download(c)[row, :, :length].float() for c in tt.kv_cache[i])


@contextmanager
def wrapped_decode_layers(tt: Any, wrap: Callable[[DecodeLayer], DecodeLayer]) -> Iterator[None]:
    """Every decode layer of `tt` runs through `wrap(original)` inside the block, `original(i, x, *args)` being
    layer i's `decode(x, *args)` (instance attributes shadowing the method; removed afterwards)."""
    wrapped = wrap(lambda i, x, *args: type(tt.layers[i]).decode(tt.layers[i], x, *args))
    for layer in tt.layers:
        layer.decode = lambda x, *args, i=layer.index: wrapped(i, x, *args)
    try:
        yield
    finally:
        for layer in tt.layers:
            del layer.decode

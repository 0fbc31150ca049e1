"""A token's logits and K/V do not depend on the rows computed beside it, on CPU in float32 and bfloat16: the
packed linears (`alpamayo.text.linear`), a speculative verify block against one-token decodes, and K rows
against one. The models here are wider than 1024 inputs, where oneDNN's one-row kernel rounds apart from its
many-row one and MKL's float32 sgemm rounds by the row count (the small test checkpoints stay below that)."""

from __future__ import annotations

import pytest
import torch

from alpamayo.text import TextModel
from alpamayo.text.linear import Linear
from tests.hf_checkpoints import save_checkpoint, text_config

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(),
    reason="no oneDNN in this build: F.linear makes no row guarantee",
)
DTYPES = [torch.float32, torch.bfloat16]
WIDE = dict(hidden_size=1152, intermediate_size=1280, moe_intermediate_size=1280)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("in_features", [64, 1280, 2048])
def test_a_linears_rows_do_not_depend_on_how_many_run(dtype, in_features):
    g = torch.Generator().manual_seed(0)
    linear = Linear(
        torch.randn(512, in_features, generator=g).to(dtype), torch.randn(512, generator=g).to(dtype)
    )
    linear.pack()
    # the packed path wherever oneDNN has it; a bfloat16 weight on a CPU without oneDNN's bfloat16 runs torch's
    # own bfloat16 GEMM (`alpamayo.text.linear`), and its rows must not depend on each other either
    packed = dtype == torch.float32 or torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert (linear.weight is None) == packed
    x = torch.randn(40, in_features, generator=g).to(dtype)
    alone = torch.cat([linear(x[i : i + 1]) for i in range(len(x))])
    for m in (2, 3, 4, 5, 8, 17, 40):
        assert torch.equal(linear(x[:m]), alone[:m]), m
    assert torch.equal(linear(x.view(5, 8, -1)), alone.view(5, 8, -1))


@pytest.fixture(scope="module", params=["dense", "moe"])
def wide_checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"wide-{request.param}")
    save_checkpoint(path, text_config(**WIDE), moe=request.param == "moe", seed=5)
    return path


PROMPT = torch.arange(3, 40)


def kv(model: TextModel, row: int) -> list[torch.Tensor]:
    """Row `row`'s cached K/V of every layer up to its length."""
    n = model.lengths[row]
    return [t[row, :, :n].clone() for t in (*model.cache.k, *model.cache.v)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_verify_block_is_one_token_decoding_bit_for_bit(wide_checkpoint, dtype):
    """Logits at every position of a block of 6, and the K/V it leaves, equal 6 one-token decodes."""
    model = TextModel.from_checkpoint(wide_checkpoint, dtype=dtype)
    model.setup_cache(64, 1)
    block = [7, 300, 12, 12, 5, 99]
    model.prefill(PROMPT)
    decoded = torch.stack([model.decode(t) for t in block])
    expected_kv = kv(model, 0)
    model.prefill(PROMPT)
    verified = model.verify(torch.tensor([block]))[0]
    assert torch.equal(verified, decoded)
    assert all(map(torch.equal, kv(model, 0), expected_kv))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_k_rows_decode_as_each_row_alone_bit_for_bit(wide_checkpoint, dtype):
    """K = 3 rows forked from one prompt, each fed its own tokens for 5 steps: each row's logits and K/V equal
    the same row decoded alone (K = 1)."""
    model = TextModel.from_checkpoint(wide_checkpoint, dtype=dtype)
    fed = torch.tensor([[4, 8, 15, 16, 23], [42, 4, 4, 9, 300], [1, 2, 3, 5, 8]])
    model.setup_cache(64, 3)
    model.prefill(PROMPT)
    model.fork(3)
    rows = torch.stack([model.decode(fed[:, j]) for j in range(fed.shape[1])], 1)  # [3, 5, V]
    together = [kv(model, r) for r in range(3)]
    for r in range(3):
        model.prefill(PROMPT)
        model.fork(1)
        alone = torch.stack([model.decode(fed[r : r + 1, j])[0] for j in range(fed.shape[1])])
        assert torch.equal(rows[r], alone), r
        assert all(map(torch.equal, kv(model, 0), together[r])), r

"""Our torch implementations of the ttnn ops without a golden function (`alpamayo.tt.golden.ops`) against a
golden sibling of each where ttnn 0.81.1 has one, else against a composition from the op's definition.

Siblings: `ttnn.transformer.split_query_key_value_and_split_heads` (both head splits),
`ttnn.transformer.concatenate_heads` (both head concats), `ttnn.experimental.rotary_embedding` (HF rotate-half,
one position at a time), `ttnn.update_cache` (one index for every user), `ttnn.sum`, `ttnn.linear` (with its
bias) and `paged_scaled_dot_product_attention_decode`'s own golden (one query tile per call).
"""

from __future__ import annotations

import pytest
import torch

from alpamayo.tt.golden import ops

pytestmark = pytest.mark.golden


@pytest.fixture(scope="module")
def golden(ttnn_host):
    """ttnn's golden function of `ttnn.<name>`."""

    def of(name: str):
        op = ttnn_host
        for part in name.split("."):
            op = getattr(op, part)
        return ttnn_host.get_golden_function(op)

    return of


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("heads, kv_heads, transpose", [(4, 2, False), (8, 1, True), (3, 3, False)])
def test_nlp_create_qkv_heads_splits_as_split_query_key_value_and_split_heads(
    golden, heads, kv_heads, transpose
):
    x = randn(2, 1, 96, (heads + 2 * kv_heads) * 32)
    got = ops.nlp_create_qkv_heads(x, heads, kv_heads, transpose)
    sibling = golden("transformer.split_query_key_value_and_split_heads")
    expected = sibling(x[:, 0], num_heads=heads, num_kv_heads=kv_heads, transpose_key=transpose)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)


@pytest.mark.parametrize("users", [1, 5, 32])
def test_nlp_create_qkv_heads_decode_gives_each_user_its_row_heads(golden, users):
    """Decode row b is the sibling's sequence position b, heads moved to dim 2: [1, B, heads, hd]."""
    heads, kv_heads, hd = 8, 2, 64
    x = randn(1, 1, users, (heads + 2 * kv_heads) * hd, seed=1)
    got = ops.nlp_create_qkv_heads_decode(x, heads, kv_heads)
    sibling = golden("transformer.split_query_key_value_and_split_heads")
    expected = sibling(x[0], num_heads=heads, num_kv_heads=kv_heads, transpose_key=False)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e.permute(0, 2, 1, 3))


def test_nlp_concat_heads_concatenates_as_concatenate_heads(golden):
    x = randn(2, 6, 64, 32, seed=2)
    expected = golden("transformer.concatenate_heads")(x)
    assert torch.equal(ops.nlp_concat_heads(x), expected[:, None])


@pytest.mark.parametrize("users", [1, 7, 32])
def test_nlp_concat_heads_decode_puts_user_b_in_row_b_and_pads_the_tile(golden, users):
    heads, hd = 5, 32
    x = randn(1, users, 32, hd, seed=3)  # heads padded to a whole tile, as the device holds them
    got = ops.nlp_concat_heads_decode(x, heads)
    expected = golden("transformer.concatenate_heads")(x[:, :, :heads].permute(0, 2, 1, 3))  # users as rows
    assert got.shape == (1, 1, 32, heads * hd)
    assert torch.equal(got[0, 0, :users], expected[0])
    assert not got[0, 0, users:].any()


@pytest.mark.parametrize("hd", [32, 128])
def test_rotary_embedding_hf_rotates_half_as_rotary_embedding(golden, hd):
    """Prefill position j and decode user j, each at its own angles, against ttnn's rotate-half golden."""
    sibling = golden("experimental.rotary_embedding")
    seq, heads = 12, 3
    cos, sin = randn(1, 1, seq, hd, seed=4), randn(1, 1, seq, hd, seed=5)
    x = randn(1, heads, seq, hd, seed=6)
    prefill = ops.rotary_embedding_hf(x, cos, sin, is_decode_mode=False)
    decode = ops.rotary_embedding_hf(
        x.permute(0, 2, 1, 3), cos.permute(0, 2, 1, 3), sin.permute(0, 2, 1, 3), True
    )
    for j in range(seq):
        expected = sibling(x[:, :, j : j + 1], cos, sin, j)
        assert torch.allclose(prefill[:, :, j : j + 1], expected, atol=1e-6)
        assert torch.allclose(decode[:, j : j + 1].permute(0, 2, 1, 3), expected, atol=1e-6)


def test_paged_update_cache_writes_as_update_cache(golden):
    """Unpaged, every user at one index: ttnn's `update_cache` golden (input [1, heads, users, hd])."""
    users, kv, seq, hd = 4, 2, 96, 32
    rows = randn(1, users, kv, hd, seed=7)
    got = torch.zeros(users, kv, seq, hd)
    ops.paged_update_cache(got, rows, torch.full((users,), 37), None, lambda r: r)
    expected = golden("update_cache")(torch.zeros(users, kv, seq, hd), rows.permute(0, 2, 1, 3), 37)
    assert torch.equal(got, expected)


def test_paged_update_cache_reads_the_page_table_skips_minus_one_and_repacks():
    """User b writes block page_table[b, i // S] at row i % S; index -1 writes nothing; rows go through
    `repack` (the cache's dtype)."""
    blocks, kv, block, hd = 5, 2, 64, 32
    rows = randn(1, 3, kv, hd, seed=8)
    cache = torch.zeros(blocks, kv, block, hd)
    table = torch.tensor([[4, 0], [1, 3], [2, 2]])
    ops.paged_update_cache(cache, rows, torch.tensor([70, 5, -1]), table, lambda r: r.round())
    expected = torch.zeros_like(cache)
    expected[0, :, 70 - block] = rows[0, 0].round()  # user 0: index 70 is block table[0, 1] = 0, row 6
    expected[1, :, 5] = rows[0, 1].round()
    assert torch.equal(cache, expected)


def test_paged_update_cache_refuses_two_users_on_one_cache_tile():
    """On a card each user's core rewrites its row's whole 32-row tile: two users of one call on one tile
    race (the kernels' read-patch-write), so the golden mode refuses the call."""
    cache = torch.zeros(2, 1, 64, 32)
    rows = randn(1, 2, 1, 32, seed=9)
    with pytest.raises(RuntimeError, match="race"):
        ops.paged_update_cache(cache, rows, torch.tensor([3, 9]), torch.tensor([[1], [1]]), lambda r: r)
    ops.paged_update_cache(cache, rows, torch.tensor([3, 40]), torch.tensor([[1], [1]]), lambda r: r)


@pytest.mark.parametrize("dims", [(0,), (1,), (0, 1)])
def test_fast_reduce_nc_sums_as_sum(golden, dims):
    x = randn(3, 4, 64, 32, seed=10)
    expected = golden("sum")(x, dims, True)
    assert torch.allclose(ops.fast_reduce_nc(x, dims), expected, atol=1e-5)


def test_minimal_matmul_is_linear_with_its_bias(golden):
    a, w, bias = randn(1, 1, 96, 64, seed=11), randn(64, 160, seed=12), randn(1, 1, 1, 160, seed=13)
    expected = golden("linear")(a, w, bias=bias[0, 0])
    assert torch.allclose(ops.minimal_matmul(a, w, bias), expected, atol=1e-5)
    assert torch.allclose(ops.minimal_matmul(a, w), golden("linear")(a, w), atol=1e-5)


def test_multi_position_flash_decode_is_one_flash_decode_per_query_tile(golden):
    """spec_multi_pos_tiles = n: user u's query tile j attends to the user's pages up to cur_pos[u n + j],
    as a one-tile call of the op's own golden with that position (its 32 rows as 32 heads of one user)."""
    sibling = golden("transformer.paged_scaled_dot_product_attention_decode")
    users, n, hd, block, pages = 3, 4, 64, 32, 6
    q = randn(1, users, n * 32, hd, seed=14)
    k, v = randn(users * pages, 1, block, hd, seed=15), randn(users * pages, 1, block, hd, seed=16)
    table = torch.stack(
        [
            torch.randperm(users * pages, generator=torch.Generator().manual_seed(u))[:pages]
            for u in range(users)
        ]
    )
    cur = torch.randint(0, pages * block, (users * n,), generator=torch.Generator().manual_seed(17))
    got = ops.paged_sdpa_decode_multi_pos(q, k, v, table, cur, n, 0.125)
    for u in range(users):
        for j in range(n):
            tile = q[:, u, j * 32 : (j + 1) * 32][None]  # [1, 1, 32 heads, hd]
            expected = sibling(
                tile, k, v, table[u : u + 1], cur_pos_tensor=cur[u * n + j : u * n + j + 1], scale=0.125
            )
            assert torch.allclose(got[0, u, j * 32 : (j + 1) * 32], expected[0, 0], atol=1e-5)

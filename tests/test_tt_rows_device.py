"""The ttnn multi-row decode program on a Blackhole p150 against the torch reference (marked `blackhole`), and
the same checks at the `accuracy` recipe in the ttnn golden mode (marked `golden`, `alpamayo.tt.golden`; traced
runs are card-only there).

K rows decode as one program, each at its own cache index (forked from the prompt on the device, ragged after
a rollback), and verify blocks of T tokens per row run as B x T rows, row b's on its own cache slot (one row:
T = 8; K = 3 rows: T = 8; K = 6 rows: T = 5, the speculative loop's cap), each slot's block attention reading
its K/V once per 8 of its rows. The reference runs
each row as its own batch-1 sequence (float32, on the recipe-rounded weights, as `test_tt_text_device.py`),
so the figures measure the device program. Accepted lengths of a greedy speculative step, computed from each
backend's own logits, must be equal. Dense tiny checkpoints in both presets (MoE layers decode one row).
"""

from __future__ import annotations

import pytest
import torch

from alpamayo.numerics import assert_agrees
from alpamayo.plan.precision import load_precision
from alpamayo.text import TextModel
from tests.routing import greedy_tie
from tests.tt_checkpoints import reference_and_device, save_tt_checkpoint
from tests.tt_modes import card_only, case_device, device_cases

CASES = [f"{name}-{recipe}" for name in ("gqa2", "gqa8-tied") for recipe in ("accuracy", "performance")]
LOGITS_PCC = 0.97  # as the single-row decode's final logits (test_tt_text_device.py)
PROMPT_LEN, MAX_SEQ_LEN, ROWS, BLOCK = 126, 256, 4, 8


def logits_pcc(expected: torch.Tensor, got: torch.Tensor, what: str) -> float:
    """The PCC of one position's logits, gated with its relative error (`assert_agrees` at LOGITS_PCC)."""
    return assert_agrees(expected, got, min_pcc=LOGITS_PCC, what=what).pcc


@pytest.fixture(scope="module", params=device_cases(CASES))
def models(request, tmp_path_factory):
    param, device = case_device(request)
    name, recipe = param.rsplit("-", 1)
    path = tmp_path_factory.mktemp(param)
    save_tt_checkpoint(path, name, seed=17)
    ref, tt = reference_and_device(path, load_precision(recipe), device)
    prompt = torch.randint(
        0, min(ref.text_cfg.vocab_size, 256), (PROMPT_LEN,), generator=torch.Generator().manual_seed(7)
    )
    yield ref, tt, prompt
    tt.close()


def reference_logits(ref: TextModel, prompt: torch.Tensor, tokens: list[int]) -> list[torch.Tensor]:
    """Float32 logits [V] after each of `tokens`, decoded one at a time after `prompt` (batch 1)."""
    ref.setup_cache(MAX_SEQ_LEN)
    ref.prefill(prompt)
    return [ref.decode(t) for t in tokens]


@pytest.mark.parametrize("traced", [False, True])
def test_k_ragged_rows_decode_as_their_own_sequences(models, traced, record_figure):
    ref, tt, prompt = models
    if traced:
        card_only(tt, "traced K rows")
    vocab = ref.text_cfg.vocab_size
    steps = torch.randint(0, min(vocab, 256), (4, ROWS), generator=torch.Generator().manual_seed(3))
    tt.setup_cache(MAX_SEQ_LEN, max_batch=ROWS)
    tt.prefill(prompt)
    tt.fork(ROWS)
    got = [tt.decode(steps[0], traced=traced)]
    keep = [b % 2 == 0 for b in range(ROWS)]  # odd rows forget their first token: ragged from here
    tt.rollback([PROMPT_LEN + int(k) for k in keep])
    got += [tt.decode(steps[j], traced=traced) for j in range(1, 4)]
    worst = 1.0
    for b in range(ROWS):
        first = [int(steps[0, b])]
        expected = reference_logits(ref, prompt, ([*first] if keep[b] else []) + steps[1:, b].tolist())
        if keep[b]:
            worst = min(worst, logits_pcc(expected[0], got[0][b], f"row {b} step 0"))
        else:  # the dropped token's logits were real too: its row then continues from the prompt
            worst = min(
                worst, logits_pcc(reference_logits(ref, prompt, first)[0], got[0][b], f"row {b} step 0")
            )
        for j in range(1, 4):
            worst = min(worst, logits_pcc(expected[j - 1 + int(keep[b])], got[j][b], f"row {b} step {j}"))
    record_figure(f"K={ROWS} ragged rows: worst logits PCC (traced={traced})", worst)
    assert worst >= LOGITS_PCC


@pytest.mark.parametrize("wrong_at", [1, 4, BLOCK])
def test_a_verify_block_scores_like_plain_decoding_and_accepts_the_same_length(
    models, wrong_at, record_figure
):
    ref, tt, prompt = models
    vocab = ref.text_cfg.vocab_size
    ref.setup_cache(MAX_SEQ_LEN)
    logits = ref.prefill(prompt)
    greedy = []
    for _ in range(BLOCK + 1):
        greedy.append(int(torch.argmax(logits)))
        logits = ref.decode(greedy[-1])
    draft = list(greedy[:BLOCK])
    if wrong_at < BLOCK:
        draft[wrong_at] = (
            draft[wrong_at] + 1
        ) % vocab  # the true continuation, corrupted at a known position
    block = [greedy[0], *draft[1:]]  # the target's own first token, then the draft
    expected = reference_logits(ref, prompt, block)
    tt.setup_cache(MAX_SEQ_LEN, max_batch=1)
    tt.prefill(prompt)
    got = tt.verify(torch.tensor([block]))[0]
    worst = min(
        logits_pcc(e, g, f"verify row {j}") for j, (e, g) in enumerate(zip(expected, got, strict=True))
    )
    record_figure(f"verify of {BLOCK}: worst logits PCC", worst)
    assert worst >= LOGITS_PCC

    def accepted(scores: list[torch.Tensor]) -> int:
        n = 1
        while n < BLOCK and int(torch.argmax(scores[n - 1])) == block[n]:
            n += 1
        return n

    n = accepted(expected)
    assert n == wrong_at  # the reference accepts up to the corruption, by construction
    got_n = accepted(list(got))
    assert got_n == n or greedy_tie(expected[min(n, got_n) - 1]), f"accepted {got_n}, reference {n}"
    tt.rollback([PROMPT_LEN + n])  # the rejected tail's K/V are stale; the next rows overwrite them
    bonus = int(torch.argmax(expected[n - 1]))
    after = tt.decode(bonus)
    logits_pcc(
        reference_logits(ref, prompt, [*block[:n], bonus])[-1], after, "the bonus token after rollback"
    )


@pytest.mark.parametrize("wrong_at", [0, 3, BLOCK - 1])
def test_a_first_block_in_the_prefill_scores_like_plain_decoding_and_forks_ragged(
    models, wrong_at, record_figure
):
    """The prompt and BLOCK - 1 drafted tokens in one prefill (`prefill_block`; scored rows 125..132 cross a
    tile and the 128-row padding): each scored row against the reference's plain decoding, the same accepted
    length, then K = 3 rows forked from it and rolled back to different kept prefixes decode as their own
    sequences."""
    ref, tt, prompt = models
    vocab = ref.text_cfg.vocab_size
    ref.setup_cache(MAX_SEQ_LEN)
    logits, greedy = ref.prefill(prompt), []
    for _ in range(BLOCK - 1):
        greedy.append(int(torch.argmax(logits)))
        logits = ref.decode(greedy[-1])
    draft = list(greedy)
    if wrong_at < BLOCK - 1:
        draft[wrong_at] = (
            draft[wrong_at] + 1
        ) % vocab  # the true continuation, corrupted at a known position
    ref.setup_cache(MAX_SEQ_LEN)
    expected = [ref.prefill(prompt), *(ref.decode(t) for t in draft)]
    tt.setup_cache(MAX_SEQ_LEN, max_batch=3)
    got = tt.prefill_block(prompt, drafted=draft)
    assert got.shape == (BLOCK, vocab) and tt.cache_len == PROMPT_LEN + len(draft)
    worst = min(
        logits_pcc(e, g, f"scored row {j}") for j, (e, g) in enumerate(zip(expected, got, strict=True))
    )
    record_figure(f"first block of {BLOCK - 1} in the prefill: worst logits PCC", worst)
    assert worst >= LOGITS_PCC

    def accepted(scores) -> int:
        j = 0
        while j < len(draft) and int(torch.argmax(scores[j])) == draft[j]:
            j += 1
        return j

    got_n = accepted(list(got))
    assert accepted(expected) == wrong_at
    assert got_n == wrong_at or greedy_tie(expected[min(wrong_at, got_n)]), (
        f"accepted {got_n}, reference {wrong_at}"
    )
    kept = [wrong_at, 0, len(draft)]
    tt.fork(3)
    tt.rollback([PROMPT_LEN + j for j in kept])
    after = tt.decode(torch.tensor([1, 2, 3]))
    for r, j in enumerate(kept):
        logits_pcc(reference_logits(ref, prompt, [*draft[:j], r + 1])[-1], after[r], f"forked row {r}")


def test_traced_rows_are_identical_to_untraced_rows(models):
    ref, tt, prompt = models
    card_only(tt, "traced against untraced rows")
    block = torch.arange(BLOCK)[None] % ref.text_cfg.vocab_size
    runs = []
    for traced in (True, False):
        tt.setup_cache(MAX_SEQ_LEN, max_batch=1)
        tt.prefill(prompt)
        runs.append([tt.verify(block, traced=traced) for _ in range(2)])  # capture, then a replay
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


@torch.inference_mode()
def test_verify_captures_the_layers_a_draft_reads(models, record_figure):
    ref, tt, prompt = models
    last = ref.text_cfg.num_hidden_layers - 1
    layers = [0, last]
    block = (torch.arange(BLOCK) * 7 % min(ref.text_cfg.vocab_size, 256)).tolist()
    ref.setup_cache(MAX_SEQ_LEN)
    ref.prefill(prompt)
    expected = []
    for j, token in enumerate(block):  # the reference's layer 0 output and normed last layer per token
        position = PROMPT_LEN + j
        cos, sin = ref.rope.cos_sin_1d(torch.tensor([position + ref.rope_delta]), ref.dtype)
        x, outs = ref.embed(torch.tensor([token]))[None], []
        for layer in ref.layers:
            x = layer(x, cos, sin, ref.cache, position)
            outs.append(x[0, 0])
        expected.append(torch.cat([outs[0], ref.norm(outs[last][None])[0]]))
    tt.setup_cache(MAX_SEQ_LEN, max_batch=1)
    tt.prefill(prompt)
    _, feats = tt.verify(torch.tensor([block]), capture=layers)
    worst = min(
        logits_pcc(e, f, f"captured features of token {j}")
        for j, (e, f) in enumerate(zip(expected, feats[0].float(), strict=True))
    )
    record_figure(f"verify of {BLOCK}: captured layers (0, last) worst PCC", worst)
    assert worst >= LOGITS_PCC


# (K rows, T tokens each): one row; K = 3 x 8 (the DFlash block size, 3 slots' block attention calls); eval's
# K = 6 at the speculative loop's block cap for 6 rows (32 // 6 = 5; 30 rows padded to 32)
ROW_BLOCKS = [(1, BLOCK), (3, BLOCK), (6, 5)]


def greedy_block(
    ref: TextModel, prompt: torch.Tensor, prefix: list[int], size: int, wrong_at: int
) -> list[int]:
    """The reference's greedy `size` tokens after prompt + prefix, as a verify block: its own first token,
    then the true continuation corrupted at `wrong_at` (none when wrong_at == size)."""
    vocab = ref.text_cfg.vocab_size
    ref.setup_cache(MAX_SEQ_LEN)
    logits = ref.prefill(prompt)
    for t in prefix:
        logits = ref.decode(t)
    block = []
    for _ in range(size):
        block.append(int(torch.argmax(logits)))
        logits = ref.decode(block[-1])
    if wrong_at < size:
        block[wrong_at] = (block[wrong_at] + 1) % vocab
    return block


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("rows, size", ROW_BLOCKS)
def test_k_ragged_rows_verify_their_own_blocks_and_accept_the_torch_lengths(
    models, rows, size, traced, record_figure
):
    """K rows of ragged lengths (forked, then rolled back), each verifying its own T-token block on its own
    cache slot in one K x T-row program, every slot's block attention reading its K/V once per 8 of its rows
    (`DecoderLayer.block_sdpa`: these checkpoints' heads fit one tile): every row's block logits match the
    reference's batch-1 decoding of that row (PCC per row and token), each row accepts the reference's length
    (a corruption at 1..T), and after the per-row rollback each row's bonus token decodes as the reference's."""
    ref, tt, prompt = models
    if traced:
        card_only(tt, "traced verify rows")
    assert tt.decoder.programs.block_sdpa
    vocab = min(ref.text_cfg.vocab_size, 256)
    steps = torch.randint(0, vocab, (2, rows), generator=torch.Generator().manual_seed(5))
    tt.setup_cache(MAX_SEQ_LEN, max_batch=rows)
    tt.prefill(prompt)
    tt.fork(rows)
    for ids in steps:
        tt.decode(ids, traced=traced)
    kept = [(b + 1) % 3 for b in range(rows)]  # row b keeps its first 0..2 decoded tokens
    tt.rollback([PROMPT_LEN + n for n in kept])
    prefixes = [steps[:n, b].tolist() for b, n in enumerate(kept)]
    wrong = [1 + (b * 3) % size for b in range(rows)]  # 1..T: T is the uncorrupted continuation
    blocks = [greedy_block(ref, prompt, p, size, w) for p, w in zip(prefixes, wrong, strict=True)]
    got = tt.verify(torch.tensor(blocks), traced=traced)
    assert tt.lengths == [PROMPT_LEN + n + size for n in kept]

    def accepted(block: list[int], scores) -> int:
        n = 1
        while n < size and int(torch.argmax(scores[n - 1])) == block[n]:
            n += 1
        return n

    worst, lengths = 1.0, []
    for b in range(rows):
        expected = reference_logits(ref, prompt, prefixes[b] + blocks[b])[len(prefixes[b]) :]
        row = min(
            logits_pcc(e, g, f"row {b} token {j}")
            for j, (e, g) in enumerate(zip(expected, got[b], strict=True))
        )
        worst = min(worst, row)
        n = accepted(blocks[b], expected)
        assert n == wrong[b]  # the reference accepts up to the corruption, by construction
        got_n = accepted(blocks[b], list(got[b]))
        assert got_n == n or greedy_tie(expected[min(n, got_n) - 1]), (
            f"row {b}: accepted {got_n}, reference {n}"
        )
        lengths.append(n)
    record_figure(f"K={rows} rows x verify of {size} (traced={traced}): worst logits PCC", worst)
    tt.rollback([PROMPT_LEN + kept[b] + lengths[b] for b in range(rows)])
    bonus = []
    for b in range(rows):
        row = prefixes[b] + blocks[b][: lengths[b]]
        bonus.append(int(torch.argmax(reference_logits(ref, prompt, row)[-1])))
    after = tt.decode(torch.tensor(bonus), traced=traced)
    for b in range(rows):
        expected = reference_logits(ref, prompt, prefixes[b] + blocks[b][: lengths[b]] + [bonus[b]])[-1]
        logits_pcc(expected, after[b], f"row {b} after its rollback")

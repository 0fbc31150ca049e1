"""Speculative decoding of the reasoning: the TextModel contract (ragged rows, verify, rollback), every draft
kind giving plain decoding's greedy and sampled tokens on the tiny dense, MoE and demo checkpoints, and
predictions (waypoints too) bit-equal to plain ones in float32 and bfloat16; the DFlash draft against a
reference composed from transformers' Qwen3 modules, and bad drafts refused before any weight is read."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from alpamayo.config.loader import load_model_config
from alpamayo.decoding.loop import generate_plans
from alpamayo.decoding.speculative import first_draft
from alpamayo.drafts import Draft, DraftContext, LookupDraft, PreviousDraft, check_draft_spec, load_draft
from alpamayo.drafts.dflash import DFlashDraft, DraftConfigError, read_config
from alpamayo.generation import Sampling, TokenSampler
from alpamayo.profiling.tracer import Tracer
from alpamayo.text import TextModel
from alpamayo.tokenizer import load_tokenizer
from planner.plans import PlanLimits
from planner.tokenizers import TrajectoryVocab
from tests.dflash_checkpoints import dflash_config, reference_block_logits, save_dflash
from tests.hf_checkpoints import load_hf, save_checkpoint, text_config

PROMPT = (
    "<|im_start|>user\nThe light ahead turned red. The light ahead turned red. What now?<|im_end|>\n"
    "<|im_start|>assistant\n<|cot_start|>"
)


class Target:
    """A torch text model with the demo checkpoint's tokenizer and trajectory vocabulary."""

    def __init__(self, model: TextModel, demo_path, hf_dir=None):
        self.cfg = load_model_config(demo_path)
        tok = load_tokenizer(demo_path)
        self.vocab = TrajectoryVocab.from_tokenizer(tok, vocab_size=self.cfg.text.vocab_size)
        self.model, self.hf_dir = model, hf_dir
        self.prompt = torch.tensor(tok(PROMPT, add_special_tokens=False)["input_ids"])

    def plans(self, sampler, limits, draft=None, stream=None, tracer=None, trajectory_tokens=True):
        """As the runtime decodes: the draft's first tokens (`self.first`) verified in the prefill."""
        m = self.model
        m.setup_cache(len(self.prompt) + limits.decode_positions, sampler.rows)
        capture = () if draft is None else draft.capture
        ctx, self.first = None, []
        if draft is not None:
            ctx = DraftContext(self.prompt.tolist(), sampler.rows, stream)
            self.first = first_draft(draft, ctx, limits, self.vocab.marker("traj_future_start"))
        logits = m.prefill_block(self.prompt, capture=capture, drafted=self.first)
        if capture:
            ctx.features = torch.cat(m.captured, -1)
        return generate_plans(
            m,
            logits,
            self.vocab,
            sampler,
            limits,
            self.cfg.eos_token_ids,
            tracer,
            trajectory_tokens,
            draft,
            ctx,
            self.first,
        )


@pytest.fixture(scope="module", params=["demo", "dense", "moe"])
def target(request, demo_checkpoint, tmp_path_factory):
    if request.param == "demo":
        return Target(TextModel.from_checkpoint(demo_checkpoint), demo_checkpoint)
    vocab = load_model_config(demo_checkpoint).text.vocab_size
    path = tmp_path_factory.mktemp(request.param)
    save_checkpoint(path, text_config(vocab_size=vocab, hidden_size=64), moe=request.param == "moe", seed=3)
    return Target(TextModel.from_checkpoint(path), demo_checkpoint, path)


GREEDY = TokenSampler.for_request(Sampling(), None, 1)


class Oracle(Draft):
    """Drafts a known continuation per row; `wrong_at` (per row, None: never) corrupts the draft from that
    index of the continuation on (a draft that is always wrong: 0). `first`: row 0's draft also opens the
    reasoning inside the prefill (`Draft.propose_first`)."""

    name = "oracle"

    def __init__(self, continuations, wrong_at=None, block_size=8, first=False):
        super().__init__(block_size)
        self.cont, self.wrong_at = continuations, wrong_at or [None] * len(continuations)
        self.first = first

    def _draft(self, r, done, n):
        w = self.wrong_at[r]
        return [
            (t + 1) % 300 if w is not None and done + j >= w else t  # any other token than the continuation's
            for j, t in enumerate(self.cont[r][done : done + n])
        ]

    def propose_first(self, ctx, limit):
        return self._draft(0, 0, limit) if self.first else []

    def propose(self, generated, limits):
        return [self._draft(r, len(g), n) for r, (g, n) in enumerate(zip(generated, limits, strict=True))]


def continuation(plan, vocab):
    return [*plan.reasoning_token_ids, vocab.marker("traj_future_start"), *plan.future_token_ids]


# ------------------------------------------------------------------ the TextModel contract
def test_verify_on_ragged_rows_equals_each_row_decoded_alone(target):
    m = target.model
    torch.manual_seed(0)
    tail = torch.randint(0, 300, (3, 6))
    m.setup_cache(64, 3)
    m.prefill(target.prompt)
    m.fork(3)
    assert m.verify(tail).shape == (3, 6, m.text_cfg.vocab_size)
    m.rollback([len(target.prompt) + 2, len(target.prompt) + 5, len(target.prompt) + 1])
    assert m.lengths == [len(target.prompt) + n for n in (2, 5, 1)]
    block = torch.randint(0, 300, (3, 3))
    ragged, feats = m.verify(block, capture=[0, 1])
    assert feats.shape == (3, 3, 2 * m.text_cfg.hidden_size)
    step = m.decode(torch.tensor([1, 2, 3]))  # decode keeps working on ragged rows
    for r, kept in enumerate((2, 5, 1)):
        m.setup_cache(64, 1)
        m.prefill(target.prompt)
        m.verify(
            tail[r : r + 1, :kept]
        )  # as the rows' first verify wrote them (a prompt's forward rounds apart)
        alone = m.verify(block[r : r + 1])[0]
        assert torch.equal(ragged[r], alone)
        assert torch.equal(step[r], m.decode(r + 1))
    with pytest.raises(ValueError, match=r"row 0 length .* must be in \[1, "):
        m.rollback([10_000])


def test_a_prefill_block_scores_its_drafted_tokens_as_plain_decoding_does(target, demo_checkpoint):
    """The prompt and n drafted tokens: row 0 is the prompt's last position's logits, row j those after the
    j-th drafted token decoded one at a time, and the cache holds what that decoding leaves; bit for bit in
    float32 and bfloat16 (the CPU linears round a row alike whatever the number of rows)."""
    drafted = [5, 6, 7, 8]
    models = [target.model]
    if target.hf_dir is None:
        models.append(TextModel.from_checkpoint(demo_checkpoint, dtype=torch.bfloat16))
    for m in models:
        m.setup_cache(64, 1)
        ref = torch.stack([m.prefill(target.prompt), *(m.decode(t) for t in drafted)])
        ref_kv = [t[:, :, : m.cache_len].clone() for t in (*m.cache.k, *m.cache.v)]
        got = m.prefill_block(target.prompt, drafted=drafted)
        assert got.shape == (5, m.text_cfg.vocab_size) and m.lengths == [len(target.prompt) + 4]
        kv = [t[:, :, : m.cache_len] for t in (*m.cache.k, *m.cache.v)]
        assert torch.equal(got, ref) and all(map(torch.equal, kv, ref_kv))
        assert torch.equal(m.prefill_block(target.prompt)[0], m.prefill(target.prompt))


# ------------------------------------------------------------------ greedy exactness
def _dflash(target, tmp_path, **over):
    cfg = dflash_config(target.model.text_cfg, **over)
    save_dflash(tmp_path / "draft", cfg)
    return DFlashDraft.load(tmp_path / "draft", target.model)


@pytest.mark.parametrize(
    "kind", ["lookup", "previous", "dflash", "oracle", "wrong", "oracle-first", "wrong-first"]
)
def test_greedy_tokens_equal_plain_decoding_with_every_draft(target, kind, tmp_path):
    """`-first`: the oracle's first block is verified in the prefill (as `previous`'s second prediction's)."""
    limits = PlanLimits(max_reasoning_tokens=40, tokens_per_future=16)
    (plain,) = target.plans(GREEDY, limits)
    cont = [continuation(plain, target.vocab)]
    first = kind.endswith("-first")
    draft = {
        "lookup": lambda: LookupDraft(8),
        "previous": lambda: PreviousDraft(8),
        "dflash": lambda: _dflash(target, tmp_path),
        "oracle": lambda: Oracle(cont, first=first),
        "wrong": lambda: Oracle(cont, wrong_at=[0], first=first),
    }[kind.removesuffix("-first")]()
    runs = 2 if kind == "previous" else 1  # `previous` drafts from the stream's prediction before
    for _ in range(runs):
        tracer = Tracer()
        (spec,) = target.plans(GREEDY, limits, draft, stream="cam0", tracer=tracer)
    assert spec.reasoning_token_ids == plain.reasoning_token_ids
    assert spec.future_token_ids == plain.future_token_ids
    assert spec.reasoning_capped == plain.reasoning_capped
    fused = bool(target.first)
    assert fused == (kind in ("previous", "oracle-first", "wrong-first"))
    produced = sum(spec.accepted_lengths)
    # each block produced its accepted drafts + 1: every reasoning token and <|traj_future_start|>, but the
    # first token when the prefill's logits chose it alone (no first block)
    assert produced == len(plain.reasoning_token_ids) + fused
    blocks = [s for s in tracer.spans if s.name == "verify"]
    assert len(blocks) == len(spec.accepted_lengths) - fused  # the first block is the prefill's
    if kind.startswith("wrong"):
        assert set(spec.accepted_lengths) == {1}
    if kind in ("oracle", "previous", "oracle-first"):
        assert np.mean(spec.accepted_lengths) > 4
    if kind in ("previous", "oracle-first"):
        assert spec.accepted_lengths[0] == 8  # 7 drafted tokens, all kept, and the target's own


@pytest.mark.parametrize("first", [False, True])
def test_ragged_rows_each_equal_their_plain_decode(target, first):
    """K = 3 rows with different drafts accept different lengths in one batch; each row's tokens equal plain.
    `first`: the rows fork from a prefill that verified a first block (row 0's correct draft)."""
    limits = PlanLimits(max_reasoning_tokens=30, tokens_per_future=8)
    (plain,) = target.plans(GREEDY, limits)
    c = continuation(plain, target.vocab)
    sampler = TokenSampler.for_request(Sampling(), None, 3)
    oracle = Oracle([c, c, c], wrong_at=[None, 0, 11], block_size=6, first=first)
    plans = target.plans(sampler, limits, oracle)
    for p in plans:
        assert p.reasoning_token_ids == plain.reasoning_token_ids
        assert p.future_token_ids == plain.future_token_ids
    lengths = [p.accepted_lengths for p in plans]
    assert lengths[0] != lengths[1] and lengths[1] != lengths[2] and set(lengths[1][first:]) == {1}
    if first:
        assert [n[0] for n in lengths] == [6, 6, 6]


def test_dflash_ragged_rows_each_equal_their_plain_decode(target, tmp_path):
    """K = 3 rows with a DFlash draft whose proposals are steered towards the true continuation by a different
    amount per row, so the rows accept different lengths and the draft's cache rows grow raggedly; each row's
    tokens equal plain greedy, and each row's draft context ends at its prompt + reasoning."""
    limits = PlanLimits(max_reasoning_tokens=30, tokens_per_future=8)
    (plain,) = target.plans(GREEDY, limits)
    c = continuation(plain, target.vocab)
    save_dflash(tmp_path / "draft", dflash_config(target.model.text_cfg, block_size=6))
    right_until = [len(c), 0, 11]

    class Steered(DFlashDraft):
        def propose(self, generated, limits):
            own = super().propose(generated, limits)
            return [
                [c[len(g) + j] if len(g) + j < right_until[r] else t for j, t in enumerate(d)]
                for r, (g, d) in enumerate(zip(generated, own, strict=True))
            ]

    draft = Steered.load(tmp_path / "draft", target.model)
    sampler = TokenSampler.for_request(Sampling(), None, 3)
    plans = target.plans(sampler, limits, draft)
    for p in plans:
        assert p.reasoning_token_ids == plain.reasoning_token_ids
        assert p.future_token_ids == plain.future_token_ids
    lengths = [p.accepted_lengths for p in plans]
    assert lengths[0] != lengths[1] and lengths[0] != lengths[2]
    assert draft.lengths == [len(target.prompt) + len(plain.reasoning_token_ids)] * 3


def test_a_bounded_verify_gets_blocks_of_its_width_and_the_same_tokens(target, monkeypatch):
    """A target that verifies at most 32 rows x tokens (ttnn: one tile) with K = 6 rows gets blocks of 32 // 6
    = 5 tokens from a block-8 draft: every verify fits, and each row's tokens equal plain decoding."""
    limits = PlanLimits(max_reasoning_tokens=30, tokens_per_future=8)
    (plain,) = target.plans(GREEDY, limits)
    c = continuation(plain, target.vocab)
    monkeypatch.setattr(target.model, "max_verify_rows", 32)
    widths = []
    verify = target.model.verify
    monkeypatch.setattr(target.model, "verify", lambda ids, *a: widths.append(ids.shape) or verify(ids, *a))
    sampler = TokenSampler.for_request(Sampling(), None, 6)
    plans = target.plans(sampler, limits, Oracle([c] * 6, wrong_at=[None, 0, 3, None, 7, 11], block_size=8))
    for p in plans:
        assert p.reasoning_token_ids == plain.reasoning_token_ids
        assert p.future_token_ids == plain.future_token_ids
        assert max(p.accepted_lengths) <= 5
    assert widths and all(rows * width <= 32 for rows, width in widths)
    assert max(width for _, width in widths) == 5  # the oracle rows fill the bounded blocks


def test_expert_mode_leaves_each_rows_marker_where_plain_decoding_does(target):
    """Without trajectory tokens, every row's <|traj_future_start|> is in the cache at prompt + reasoning."""
    limits = PlanLimits(max_reasoning_tokens=24, tokens_per_future=8)
    (plain,) = target.plans(GREEDY, limits, trajectory_tokens=False)
    c = continuation(plain, target.vocab)
    sampler = TokenSampler.for_request(Sampling(), None, 2)
    plans = target.plans(sampler, limits, Oracle([c, c], wrong_at=[None, 0]), trajectory_tokens=False)
    n = len(target.prompt) + len(plain.reasoning_token_ids) + 1
    assert [p.reasoning_token_ids for p in plans] == [plain.reasoning_token_ids] * 2
    assert target.model.lengths == [n, n]


@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize("cap", [0, 1, 5, 13])
def test_the_reasoning_cap_forces_the_stop_where_plain_decoding_does(target, cap, first):
    """`first`: the prefill verifies a first block, which holds the cap itself for cap < 8."""
    limits = PlanLimits(max_reasoning_tokens=cap, tokens_per_future=4)
    (plain,) = target.plans(GREEDY, limits)
    long = continuation(target.plans(GREEDY, PlanLimits(40, 4))[0], target.vocab)
    (spec,) = target.plans(GREEDY, limits, Oracle([long], first=first))
    assert (spec.reasoning_token_ids, spec.reasoning_capped) == (
        plain.reasoning_token_ids,
        plain.reasoning_capped,
    )
    assert spec.future_token_ids == plain.future_token_ids
    assert len(target.first) == (min(cap, 7) if first else 0)


def test_a_stop_in_the_middle_of_a_drafted_block_ends_the_row_there(target):
    """The draft runs past <|traj_future_start|> (with <|cot_end|> inside the block): the row ends at the
    stop, as plain decoding does; the tokens drafted after it are never kept."""
    cot_end, start = target.vocab.marker("cot_end"), target.vocab.marker("traj_future_start")
    limits = PlanLimits(max_reasoning_tokens=40, tokens_per_future=8)
    (plain,) = target.plans(GREEDY, limits)
    # a draft equal to the plain reasoning with a <|cot_end|> inside the last block, then the stop and more
    cont = [*plain.reasoning_token_ids, start, cot_end, 5, 6, 7, 8]
    (spec,) = target.plans(GREEDY, limits, Oracle([cont], block_size=8))
    assert spec.reasoning_token_ids == plain.reasoning_token_ids
    assert spec.future_token_ids == plain.future_token_ids


def test_a_first_block_is_cut_before_the_stop(target):
    """A first draft that runs into <|traj_future_start|> is cut before it: the prefill verifies the tokens
    before the stop, and the row still ends where plain decoding does."""
    start = target.vocab.marker("traj_future_start")
    limits = PlanLimits(max_reasoning_tokens=40, tokens_per_future=8)
    (plain,) = target.plans(GREEDY, limits)
    cont = [*plain.reasoning_token_ids[:2], start, 5, 6, 7, 8]
    (spec,) = target.plans(GREEDY, limits, Oracle([cont], first=True))
    assert target.first == plain.reasoning_token_ids[:2]
    assert spec.accepted_lengths[0] == 3
    assert spec.reasoning_token_ids == plain.reasoning_token_ids
    assert spec.future_token_ids == plain.future_token_ids


# ------------------------------------------------------------------ sampling: plain sampling's tokens
@pytest.mark.parametrize("kind", ["lookup", "previous", "dflash", "oracle", "oracle-first"])
def test_sampled_tokens_equal_plain_sampling_with_every_draft(target, kind, tmp_path):
    """K = 3 rows at NVIDIA's default sampling (temperature 0.6, top_p 0.98), seed 7: with any draft, each
    row's reasoning and trajectory tokens are plain sampling's, token for token (a position's token is keyed
    by (seed, row, position) and drawn from the same logits by a decode step or a verify block). `oracle`:
    row 0 is drafted its own plain continuation (all kept), row 1 a wrong one from its first token (none
    kept), row 2 one that turns wrong at its 5th token; `-first`: row 0's opens the reasoning in the prefill,
    for every row (ragged: each keeps its own prefix)."""
    limits = PlanLimits(max_reasoning_tokens=24, tokens_per_future=8)
    sampling = Sampling(temperature=0.6, top_p=0.98)
    plain = target.plans(TokenSampler.for_request(sampling, 7, 3), limits)
    conts = [continuation(p, target.vocab) for p in plain]
    draft = {
        "lookup": lambda: LookupDraft(8),
        "previous": lambda: PreviousDraft(8),
        "dflash": lambda: _dflash(target, tmp_path),
        "oracle": lambda: Oracle(conts, wrong_at=[None, 0, 4], first=kind.endswith("-first")),
    }[kind.removesuffix("-first")]()
    for _ in range(2 if kind == "previous" else 1):  # `previous` drafts from the stream's prediction before
        spec = target.plans(TokenSampler.for_request(sampling, 7, 3), limits, draft, stream="cam0")
    for s, p in zip(spec, plain, strict=True):
        assert (s.reasoning_token_ids, s.reasoning_capped) == (p.reasoning_token_ids, p.reasoning_capped)
        assert s.future_token_ids == p.future_token_ids
    fused = bool(target.first)
    for s, p in zip(spec, plain, strict=True):
        assert sum(s.accepted_lengths) == len(p.reasoning_token_ids) + fused
    if kind.startswith("oracle"):
        assert np.mean(spec[0].accepted_lengths) > 4
        assert set(spec[1].accepted_lengths[fused:]) == {1}


# ------------------------------------------------------------------ DFlash
def test_dflash_block_logits_equal_the_transformers_composition(tmp_path, demo_checkpoint):
    path = tmp_path / "dense"
    save_checkpoint(path, text_config(vocab_size=load_model_config(demo_checkpoint).text.vocab_size), seed=5)
    target = TextModel.from_checkpoint(path)
    cfg = dflash_config(target.text_cfg, block_size=6, target_layer_ids=[0, 1])
    weights = save_dflash(tmp_path / "draft", cfg, seed=1)
    draft = DFlashDraft.load(tmp_path / "draft", target)
    ids = torch.randint(0, 300, (17,), generator=torch.Generator().manual_seed(0))
    target.setup_cache(64, 1)
    target.prefill_hidden(ids, capture=draft.capture)
    feats = torch.cat(target.captured, -1)
    hf = load_hf(path)
    with torch.no_grad():
        out = hf.model.language_model(input_ids=ids[None], output_hidden_states=True)
        ref_feats = torch.cat(
            [out.hidden_states[i + 1] for i in cfg["dflash_config"]["target_layer_ids"]], -1
        )
        torch.testing.assert_close(feats[None], ref_feats, atol=1e-4, rtol=1e-4)
        block = torch.tensor([42] + [cfg["dflash_config"]["mask_token_id"]] * 5)
        noise = hf.model.language_model.embed_tokens(block)[None]
        ref = reference_block_logits(cfg, weights, ref_feats, noise, hf.lm_head)[0]
    draft.begin(DraftContext(ids.tolist(), 1, None, feats))
    got = draft.block_logits([42])[0]
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_dflash_cached_context_equals_the_cache_free_composition_on_ragged_rows(tmp_path, demo_checkpoint):
    """The draft's K/V cache (the prompt once for 3 rows, then each row's accepted positions, ragged, with a
    block drafted between appends whose K/V the next append overwrites) gives the block logits that z-lab's
    composition computes from scratch over each row's whole context."""
    target = TextModel.from_checkpoint(demo_checkpoint)
    t = target.text_cfg
    cfg = dflash_config(t, block_size=5, target_layer_ids=[0, 1])
    weights = save_dflash(tmp_path / "draft", cfg, seed=2)
    draft = DFlashDraft.load(tmp_path / "draft", target)
    target.setup_cache(64, 3)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randn(9, 2 * t.hidden_size, generator=g)
    draft.begin(DraftContext(list(range(9)), 3, None, prompt))
    context = [prompt] * 3
    for kept in ([3, 1, 5], [2, 4, 1], [1, 1, 3]):
        draft.block_logits([7, 8, 9])  # a block's K/V lands after each row's context; lengths stay
        for r, n in enumerate(kept):
            feats = torch.randn(n, 2 * t.hidden_size, generator=g)
            draft.accepted(r, [0] * n, feats)
            context[r] = torch.cat([context[r], feats])
    assert draft.lengths == [9 + 6, 9 + 6, 9 + 9]
    anchors = [11, 12, 13]
    got = draft.block_logits(anchors)
    mask = cfg["dflash_config"]["mask_token_id"]
    with torch.no_grad():
        for r, a in enumerate(anchors):
            noise = target.embed(torch.tensor([a] + [mask] * 4))[None]
            ref = reference_block_logits(cfg, weights, context[r][None], noise, target.logits)[0]
            torch.testing.assert_close(got[r], ref, atol=1e-4, rtol=1e-4)
            assert torch.equal(got[r].argmax(-1), ref.argmax(-1))


def test_zlab_config_field_names_load(tmp_path, demo_checkpoint):
    target = load_model_config(demo_checkpoint).text
    cfg = dflash_config(target, block_size=16, input_embedding_scale=2.0, output_multiplier=0.5)
    cfg["final_logit_softcapping"] = 30.0
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    got = read_config(tmp_path)
    assert (got.block_size, got.mask_token_id, got.target_layer_ids) == (16, target.vocab_size - 1, (0, 2, 3))
    assert (got.input_embedding_scale, got.output_multiplier, got.final_logit_softcapping) == (2.0, 0.5, 30.0)
    assert got.text.num_hidden_layers == 2 and got.text.head_dim == 32


BAD = {
    "hidden": (dict(hidden_size=96), r"hidden_size 96 != the target's 128"),
    "vocab": (dict(vocab_size=1000), r"vocab_size 1000 != the target's 4566"),
    "layers": (dict(target_layer_ids=[1, 9]), r"target_layer_ids \[9\] beyond the target's layers \[0, 4\)"),
    "mask": (dict(mask_token_id=None), r"mask_token_id is missing"),
    "block0": (dict(block_size=0), r"block_size must be an integer in \[2, 32\], got 0"),
    "dflash2": (dict(architectures=["DFlash2DraftModel"]), r"DFlash2DraftModel \(DFlash2 .*not supported"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_drafts_are_refused_before_any_weight_is_read(case, tmp_path, demo_checkpoint):
    over, message = BAD[case]
    model = TextModel.from_checkpoint(demo_checkpoint)
    cfg = dflash_config(model.text_cfg, **over)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes(b"not read")  # reading any weight would fail differently
    with pytest.raises(DraftConfigError, match=message):
        load_draft(f"dflash:{tmp_path}", model)


def test_model_free_drafts_open_the_reasoning_from_the_prompt_and_the_stream():
    """`lookup`'s first block continues the prompt's last n-gram where it occurred before (reading on into
    what it drafts); `previous`'s is the opening of the stream's previous reasoning; neither has one without
    a source."""
    ctx = DraftContext([7, 1, 2, 3, 9, 1, 2], 1, "cam0")
    assert LookupDraft(8).propose_first(ctx, 5) == [3, 9, 1, 2, 3]
    assert LookupDraft(8).propose_first(DraftContext([1, 2, 3], 1), 5) == []
    previous = PreviousDraft(8)
    assert previous.propose_first(ctx, 3) == []
    previous.begin(ctx)
    previous.end([[40, 41, 42, 43, 44]])
    assert previous.propose_first(ctx, 3) == [40, 41, 42]
    assert previous.propose_first(DraftContext([1], 1, "cam1"), 3) == []


def test_previous_without_a_stream_and_unknown_kinds_are_refused(demo_checkpoint):
    for call in (lambda d, c: d.begin(c), lambda d, c: d.propose_first(c, 4)):
        with pytest.raises(ValueError, match="draft 'previous' needs a stream to draw on"):
            call(PreviousDraft(8), DraftContext([1, 2], 1, None))
    with pytest.raises(
        ValueError, match=r"draft must be one of none, lookup, previous, dflash:DIR, got 'ngram'"
    ):
        check_draft_spec("ngram")
    with pytest.raises(ValueError, match="is not a directory"):
        check_draft_spec("dflash:/nonexistent/draft")


# ------------------------------------------------------------------ runtime, records, node config
def _same_samples(got, ref) -> None:
    """Every sample of two predictions equal, bit for bit: reasoning, trajectory tokens, actions, waypoints."""
    assert len(got.samples) == len(ref.samples)
    for a, b in zip(got.samples, ref.samples, strict=True):
        assert (a.reasoning_token_ids, a.token_ids, a.reasoning_capped) == (
            b.reasoning_token_ids,
            b.token_ids,
            b.reasoning_capped,
        )
        for field in ("actions", "xyz", "heading"):
            assert getattr(a, field).tobytes() == getattr(b, field).tobytes(), field


@pytest.mark.parametrize(
    "decoder, dtype, sampling",
    [
        ("expert", "float32", Sampling()),
        ("expert", "float32", Sampling(0.6, 0.98)),
        ("expert", "bfloat16", Sampling()),
        ("expert", "bfloat16", Sampling(0.6, 0.98)),
        ("tokens", "float32", Sampling(0.6, 0.98)),
    ],
    ids=[
        "expert-float32-greedy",
        "expert-float32-T0.6",
        "expert-bfloat16-greedy",
        "expert-bfloat16-T0.6",
        "tokens",
    ],
)
def test_predictions_with_any_draft_equal_plain_ones_bit_for_bit(
    demo_checkpoint, tmp_path, decoder, dtype, sampling
):
    """Greedy (one row) or at NVIDIA's default sampling (two rows, seed 3), in float32 and bfloat16: with every
    draft (lookup, previous, a DFlash draft) every sample equals plain decoding's, waypoints included, bit for
    bit: the reasoning, then the action expert, which reads the K/V the verify blocks left (float32 verify
    blocks used to round ~1e-6 apart, which the demo's random expert amplified to tenths of a metre), or the
    sampled trajectory tokens."""
    from alpamayo.model_spec import ModelSpec
    from alpamayo.runtime import AlpamayoVLA
    from tests.test_runtime import frames_at, straight_history

    frames, times = frames_at(3)
    ego = straight_history()
    save_dflash(tmp_path / "draft", dflash_config(load_model_config(demo_checkpoint).text))
    rows = 1 if sampling.greedy else 2

    def load(draft: str) -> AlpamayoVLA:
        spec = ModelSpec(
            checkpoint=demo_checkpoint,
            dtype=dtype,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_reasoning_tokens=12,
            decoder=decoder,
            draft=draft,
        )
        return AlpamayoVLA.from_spec(spec)

    def predict(vla: AlpamayoVLA):
        return vla.predict(frames, ego, frame_times_ns=times, stream="front", num_samples=rows, seed=3)

    ref = predict(load("none"))
    assert (ref.draft, ref.accepted_lengths, ref.mean_accepted_length) == ("none", [], None)
    for kind in ("lookup", "previous", f"dflash:{tmp_path / 'draft'}"):
        vla = load(kind)
        if kind == "previous":  # the stream's second prediction drafts from the first
            predict(vla)
        tracer_mark = vla.tracer.mark()
        got = predict(vla)
        _same_samples(got, ref)
        assert got.draft == kind and len(got.accepted_lengths) == rows
        fused = [s for s in vla.tracer.spans if s.name == "prefill"][-1].args["drafted"] > 0
        assert fused == (kind == "previous")  # its second prediction opens with the first's reasoning
        for blocks, sample in zip(got.accepted_lengths, ref.samples, strict=True):
            assert sum(blocks) == len(sample.reasoning_token_ids) + fused
        assert {"draft", "verify"} <= set(vla.tracer.totals_ms(tracer_mark))
        if kind == "previous" and sampling.greedy:
            assert got.mean_accepted_length > 2


def test_a_lockstep_replay_publishes_the_same_bytes_with_any_draft(demo_checkpoint, tmp_path):
    """`alpamayo replay` of the demo drive (2 ticks, the action expert) in float32 at NVIDIA's default
    sampling, seeded: with --draft lookup or previous, every message of the output MCAP but the timings equals
    the run without a draft, byte for byte (the predictions above cover DFlash and bfloat16)."""
    from alpamayo.demo_drive import make_demo_drive
    from alpamayo.replay.outputs import TIMINGS_TOPIC
    from tests.test_replay import DRIVE, messages, replay

    drive = make_demo_drive(tmp_path / "drive.mcap", **DRIVE).path
    args = ["--temperature", "0.6", "--top-p", "0.98", "--seed", "5", "--max-reasoning-tokens", "12"]
    published = {}
    for draft in ("none", "lookup", "previous"):
        out = tmp_path / f"{draft}.mcap"
        assert replay(drive, demo_checkpoint, out, *args, "--no-progress", "--draft", draft) == 0
        published[draft] = messages(out)
        assert len(published[draft].pop(TIMINGS_TOPIC)) == 2
    plain = published.pop("none")
    assert len(plain["/alpamayo/prediction"]) == 2
    for draft, got in published.items():
        assert got == plain, draft


def test_the_node_config_checks_model_draft(tmp_path):
    from alpamayo.errors import ConfigError
    from bridges.node.config import ModelSection

    assert ModelSection(draft="lookup").draft == "lookup"
    assert ModelSection(draft=f"dflash:{tmp_path}").draft == f"dflash:{tmp_path}"
    with pytest.raises(
        ConfigError, match=r"model.draft = 'eagle' is invalid; allowed: none, lookup, previous"
    ):
        ModelSection(draft="eagle")

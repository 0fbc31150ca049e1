"""The action expert after a speculative reasoning reads what plain decoding leaves in the KV cache.

Why the expert's waypoints once moved (up to 0.37 m on the demo checkpoint) although the reasoning tokens were
equal: a verify computed its block's attention in one masked kernel, which rounds differently from the
one-token decode kernel, so the reasoning's K/V in the cache differed (float32: up to 4.3e-6, with MKL's GEMM
rounding below; bfloat16: up to 0.034, which also flipped a greedy token of the demo checkpoint 24 tokens in).
The expert's offsets, action positions and mask were the same, the prompt's K/V bit-equal, its noise drawn
from its own seed stream; the demo's random expert then amplified the difference (float32 velocity 8.6e-7
apart at step 0, x 0.19 apart after 10 Euler steps; a 1e-6 change of the initial noise moves it as much:
the chaotic field `tests/test_expert_golden.py` documents). Verify now attends stepwise
(`alpamayo.text.attention.Attention._stepwise`), and the CPU linears give each row the same result whatever
the number of rows in float32 and bfloat16 (`alpamayo.text.linear`; float32 went through MKL's GEMM, which
rounded a row ~1e-6 apart with the row count), so the cache's K/V and the expert's actions are bit-equal to
plain decoding's in both dtypes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file, save_file

from alpamayo.checkpoint import open_checkpoint
from alpamayo.config.expert import expert_config_of, parse_expert_config
from alpamayo.config.loader import load_model_config
from alpamayo.drafts import Draft, LookupDraft, PreviousDraft
from alpamayo.expert.decoding import offsets_after_reasoning
from alpamayo.expert.demo import random_expert_weights
from alpamayo.expert.model import ExpertContext
from alpamayo.expert.sampler import euler_sample, initial_noise
from alpamayo.expert.weights import load_expert
from alpamayo.generation import Sampling, TokenSampler
from alpamayo.text import TextModel
from planner.plans import PlanLimits
from tests.hf_checkpoints import save_checkpoint, text_config
from tests.test_expert_golden import EXPERT_RAW
from tests.test_speculative import Oracle, Target, _dflash, continuation

LIMITS = PlanLimits(max_reasoning_tokens=30, tokens_per_future=8)


def _demo(demo_checkpoint, dtype):
    ckpt, cfg = open_checkpoint(demo_checkpoint)
    text = TextModel.from_checkpoint(ckpt, cfg, dtype=dtype)
    return Target(text, demo_checkpoint), load_expert(ckpt, expert_config_of(cfg), cfg.text, dtype)


@pytest.fixture(scope="module")
def moe_checkpoint(demo_checkpoint, tmp_path_factory):
    """A tiny MoE VLM with a random flat-layout expert in its safetensors (`test_expert_golden`'s): a copy of
    the VLM's text config, so MoE layers of its own, reading the MoE layers' K/V cache."""
    text = text_config(vocab_size=load_model_config(demo_checkpoint).text.vocab_size)
    path = tmp_path_factory.mktemp("moe-expert")
    save_checkpoint(path, text, moe=True, seed=3)
    vlm = load_model_config(path)
    cfg = parse_expert_config(EXPERT_RAW, vlm.raw_text_config, vlm_kind=vlm.kind)
    tensors = load_file(path / "model.safetensors")
    save_file({**tensors, **random_expert_weights(cfg, seed=4)}, path / "model.safetensors")
    return path, cfg


@pytest.fixture(scope="module", params=["demo-float32", "demo-bfloat16", "moe-float32", "moe-bfloat16"])
def pair(request, demo_checkpoint, moe_checkpoint):
    """(Target, its action expert) in the parameter's dtype."""
    name, dtype = request.param.split("-")
    dtype = getattr(torch, dtype)
    if name == "demo":
        return _demo(demo_checkpoint, dtype)
    path, cfg = moe_checkpoint
    text = TextModel.from_checkpoint(path, dtype=dtype)
    return Target(text, demo_checkpoint, path), load_expert(path, cfg, text.text_cfg, dtype)


class Ragged(Draft):
    """`inner`'s proposals with row r cut to at most `cuts[r]` tokens: K = 3 rows that verify blocks of
    different widths in one batch (a row with fewer drafts is padded with filler, rolled back afterwards)."""

    def __init__(self, inner: Draft, cuts=(31, 0, 2)):
        super().__init__(inner.block_size)
        self.inner, self.cuts, self.capture, self.name = inner, cuts, inner.capture, inner.name

    def propose_first(self, ctx, limit):
        return self.inner.propose_first(ctx, limit)

    def begin(self, ctx):
        self.inner.begin(ctx)

    def propose(self, generated, limits):
        return [list(d)[:c] for d, c in zip(self.inner.propose(generated, limits), self.cuts, strict=True)]

    def accepted(self, row, tokens, features):
        self.inner.accepted(row, tokens, features)

    def end(self, reasoning):
        self.inner.end(reasoning)


def _context(target: Target, expert, plans) -> ExpertContext:
    """The expert's context over the model's cache after `plans`, its K/V copied out of the live cache."""
    m = target.model
    ctx = expert.context(
        m.cache, offsets_after_reasoning(len(target.prompt), plans), m.rope_delta, m.cache_len
    )
    return dataclasses.replace(
        ctx, keys=[k.clone() for k in ctx.keys], values=[v.clone() for v in ctx.values]
    )


def _flow(expert, ctx: ExpertContext, x0: torch.Tensor) -> torch.Tensor:
    """10 Euler steps from x0 -> actions [K, 64, 2]."""
    return euler_sample(x0, expert.cfg.num_inference_steps, lambda x, t: expert.velocity(x, t, ctx))


DRAFTS = ["lookup", "previous", "dflash", "oracle", "wrong", "oracle-first", "wrong-first"]  # -first: the
# first block verified in the prefill (as `previous`'s second prediction's)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("kind", DRAFTS)
def test_the_expert_after_a_speculative_reasoning_equals_plain_decoding(pair, kind, rows, tmp_path):
    target, expert = pair
    sampler = lambda: TokenSampler.for_request(Sampling(), None, rows)  # noqa: E731
    plain = target.plans(sampler(), LIMITS, trajectory_tokens=False)
    ref = _context(target, expert, plain)
    conts = [continuation(p, target.vocab) for p in plain]
    draft = {
        "lookup": lambda: LookupDraft(8),
        "previous": lambda: PreviousDraft(8),
        "dflash": lambda: _dflash(target, tmp_path),
        "oracle": lambda: Oracle(conts, first=kind.endswith("-first")),
        "wrong": lambda: Oracle(conts, wrong_at=[0] * rows, first=kind.endswith("-first")),
    }[kind.removesuffix("-first")]()
    if rows == 3:
        draft = Ragged(draft)
    for _ in range(2 if kind == "previous" else 1):  # `previous` drafts from the stream's prediction before
        spec = target.plans(sampler(), LIMITS, draft, stream="cam0", trajectory_tokens=False)
    got = _context(target, expert, spec)
    assert [p.reasoning_token_ids for p in spec] == [p.reasoning_token_ids for p in plain]
    if kind == "oracle" and rows == 3:
        accepted = [p.accepted_lengths for p in spec]
        assert accepted[0] != accepted[1] != accepted[2] and set(accepted[1]) == {1}
    # what the expert is told: bit-equal whatever the dtype
    for field in ("offsets", "positions", "bias", "cos", "sin"):
        assert torch.equal(getattr(got, field), getattr(ref, field)), field
    x0 = initial_noise(rows, expert.n_tokens, 1.0, seed=0)
    for a, b in zip(got.keys + got.values, ref.keys + ref.values, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(_flow(expert, got, x0), _flow(expert, ref, x0))


def test_stale_cache_entries_past_each_rows_marker_never_reach_the_expert(demo_checkpoint):
    """K = 3 sampled rows of different reasoning lengths, decoded with a draft that is always wrong (every
    block leaves 7 rolled-back K/V behind): every cache position the expert masks (a shorter row's positions
    after its <|traj_future_start|>: rolled-back drafts, filler) can hold anything; its velocities stay
    bit-equal."""
    target, expert = _demo(demo_checkpoint, torch.float32)
    bias = torch.zeros(target.model.text_cfg.vocab_size)
    bias[target.vocab.marker("traj_future_start")] = 2.0  # rows then end after a few to 30 tokens
    target.model.head.bias = bias
    sampler = TokenSampler.for_request(Sampling(temperature=0.6, top_p=0.98), 5, 3)
    wrong = Oracle([list(range(5, 5 + LIMITS.max_reasoning_tokens))] * 3, wrong_at=[0] * 3)
    plans = target.plans(sampler, LIMITS, wrong, trajectory_tokens=False)
    ctx = _context(target, expert, plans)
    assert len({len(p.reasoning_token_ids) for p in plans}) > 1, "rows of equal length test nothing"
    x, t = initial_noise(3, expert.n_tokens, 1.0, seed=1), torch.full((3,), 0.3)
    before = expert.velocity(x, t, ctx)
    garbage = torch.Generator().manual_seed(2)
    for buf in ctx.keys + ctx.values:
        for row, offset in enumerate(ctx.offsets.tolist()):
            tail = buf[row, :, offset:]
            tail.copy_(1e3 * torch.randn(tail.shape, generator=garbage))
    assert torch.equal(expert.velocity(x, t, ctx), before)

"""Reasoning-then-trajectory generation on the demo checkpoint's text model and real tokenizer, against
transformers' `generate` with the same constraints, plus sampling semantics against transformers' warpers
and the keyed sampler's draws against `torch.multinomial` on the same processed distribution."""

from __future__ import annotations

import pytest
import torch

from alpamayo.config.loader import load_model_config
from alpamayo.decoding.loop import generate_plans
from alpamayo.generation import Sampling, TokenSampler, nucleus_logits, row_seeds
from alpamayo.profiling.tracer import Tracer
from alpamayo.text import TextModel
from alpamayo.tokenizer import load_tokenizer
from planner.plans import PlanLimits
from planner.tokenizers import TrajectoryVocab
from tests.hf_checkpoints import PlanConstraints, load_alpamayo_hf

PROMPT = (
    "<|im_start|>user\nThe light ahead turned red. What now?<|im_end|>\n<|im_start|>assistant\n<|cot_start|>"
)


class Demo:
    def __init__(self, path):
        self.cfg = load_model_config(path)
        self.tokenizer = load_tokenizer(path)
        self.vocab = TrajectoryVocab.from_tokenizer(self.tokenizer, vocab_size=self.cfg.text.vocab_size)
        self.model = TextModel.from_checkpoint(path, self.cfg)
        self.prompt = torch.tensor(self.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
        self.path = path

    def plans(self, sampler: TokenSampler, limits: PlanLimits, tracer: Tracer | None = None):
        """Prefill once, then generate sampler.rows plans from the shared prompt cache."""
        self.model.setup_cache(len(self.prompt) + limits.decode_positions, sampler.rows)
        logits = self.model.prefill(self.prompt)
        return generate_plans(self.model, logits, self.vocab, sampler, limits, self.cfg.eos_token_ids, tracer)


@pytest.fixture(scope="module")
def demo(demo_checkpoint):
    return Demo(demo_checkpoint)


def test_greedy_plan_matches_transformers_generate(demo, record_figure):
    from transformers import GenerationConfig, LogitsProcessorList

    limits = PlanLimits(max_reasoning_tokens=20, tokens_per_future=128)
    (plan,) = demo.plans(TokenSampler.for_request(Sampling(), None, 1), limits)

    hf = load_alpamayo_hf(demo.path)
    n = len(demo.prompt)
    gen = GenerationConfig(do_sample=False, max_new_tokens=limits.max_reasoning_tokens + 1 + 128)
    gen.eos_token_id, gen.pad_token_id = None, demo.cfg.eos_token_ids[-1]
    with torch.no_grad():
        hf.model.rope_deltas = None
        out = hf.generate(
            input_ids=demo.prompt.view(1, -1),
            attention_mask=torch.ones(1, n, dtype=torch.long),
            generation_config=gen,
            logits_processor=LogitsProcessorList(
                [PlanConstraints(demo.vocab, demo.cfg.eos_token_ids, n, limits.max_reasoning_tokens)]
            ),
        )[0, n:].tolist()
    start = out.index(demo.vocab.marker("traj_future_start"))
    assert plan.reasoning_token_ids == out[:start]
    assert plan.future_token_ids == out[start + 1 : start + 129]
    assert plan.reasoning_capped == (start == limits.max_reasoning_tokens)
    # each bin is the one its token names, checked through the tokenizer's strings
    tokens = demo.tokenizer.convert_ids_to_tokens(plan.future_token_ids)
    assert tokens == [f"<i{b}>" for b in plan.future_bins]
    record_figure("greedy tokens equal to transformers", f"{len(plan.reasoning_token_ids) + 129}")


def test_samples_in_one_batch_equal_samples_run_alone(demo):
    """K rows forked from one prefill give what each row gives from its own prefill: the KV copy is exact."""
    sampling, limits = Sampling(temperature=0.8, top_p=0.95), PlanLimits(8, 24)
    batch = demo.plans(TokenSampler.for_request(sampling, 1234, 3), limits)
    seeds = row_seeds(1234, 3)
    for i in (0, 2):
        (alone,) = demo.plans(TokenSampler(sampling, [seeds[i]]), limits)
        assert alone.reasoning_token_ids == batch[i].reasoning_token_ids
        assert alone.future_token_ids == batch[i].future_token_ids
    assert batch[0].future_token_ids != batch[1].future_token_ids  # independent streams
    again = demo.plans(TokenSampler.for_request(sampling, 1234, 2), limits)
    assert [p.future_token_ids for p in again] == [p.future_token_ids for p in batch[:2]]


def test_reasoning_ends_on_traj_future_start_or_at_the_cap(demo):
    """Near-uniform sampling over the ~560 tokens allowed in the reasoning: with this seed one of 8 rows emits
    <|traj_future_start|> (after 109 tokens) and 7 are cut off by the cap."""
    limits = PlanLimits(max_reasoning_tokens=160, tokens_per_future=8)
    tracer = Tracer()
    plans = demo.plans(TokenSampler.for_request(Sampling(temperature=50.0), 5, 8), limits, tracer)
    blocked = set(demo.vocab.future_ids.tolist()) | set(demo.vocab.history_ids.tolist())
    blocked |= set(demo.cfg.eos_token_ids)
    future = set(demo.vocab.future_ids.tolist())
    for plan in plans:
        assert not blocked & set(plan.reasoning_token_ids)
        assert len(plan.reasoning_token_ids) <= limits.max_reasoning_tokens
        assert plan.reasoning_capped == (len(plan.reasoning_token_ids) == limits.max_reasoning_tokens)
        assert len(plan.future_token_ids) == 8 and set(plan.future_token_ids) <= future
        assert plan.future_bins.min() >= 0 and plan.future_bins.max() < 3000
    capped = [p.reasoning_capped for p in plans]
    assert any(capped) and not all(capped), capped
    assert [s.name for s in tracer.spans] == ["reasoning_decode", "trajectory_decode"]


def test_nucleus_sampling_matches_transformers_warpers():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    logits = torch.randn(4, 997, generator=torch.Generator().manual_seed(0)) * 3
    for temperature, top_p in [(0.6, 0.98), (1.0, 0.5), (1.7, 0.9), (0.3, 1.0)]:
        expected = TopPLogitsWarper(top_p)(None, TemperatureLogitsWarper(temperature)(None, logits.clone()))
        torch.testing.assert_close(nucleus_logits(logits, temperature, top_p), expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.1), r"temperature must be a finite number >= 0 \(0 = greedy\), got -0.1"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\], got 0.0"),
        (dict(temperature=float("nan")), r"temperature must be a finite number"),
    ],
)
def test_bad_sampling_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sampling(**kwargs)


# the family default (NVIDIA's: temperature 0.6, top_p 0.98), a top-k cut under a nucleus, and plain softmax
DISTRIBUTIONS = [Sampling(0.6, 0.98), Sampling(1.0, 0.9, top_k=8), Sampling(1.5)]


def keyed_draws(sampling: Sampling, logits: torch.Tensor, per_row: int) -> list[int]:
    """`per_row` positions of each of 3 rows of seed 11."""
    sampler = TokenSampler.for_request(sampling, 11, 3)
    return [sampler.token(r, p, logits) for r in range(3) for p in range(per_row)]


@pytest.mark.parametrize("sampling", DISTRIBUTIONS, ids=str)
def test_keyed_samples_follow_the_processed_distribution_as_multinomial_does(sampling):
    """6000 keyed draws (3 rows x 2000 positions) from fixed logits against the processed distribution p =
    softmax(nucleus_logits): a chi-square goodness-of-fit test, and a two-sample test against 6000 draws of
    `torch.multinomial` on p, each at significance 0.001 (fixed seeds, so the verdicts are fixed too). No
    draw leaves the nucleus. The same test tells the draws from p at temperature 0.7 (it can fail)."""
    from scipy.stats import chi2_contingency, chisquare

    logits = torch.randn(60, generator=torch.Generator().manual_seed(1)) * 1.5
    p = nucleus_logits(logits[None], sampling.temperature, sampling.top_p, sampling.top_k).softmax(-1)[0]
    drawn = torch.bincount(torch.tensor(keyed_draws(sampling, logits, 2000)), minlength=60)
    n = int(drawn.sum())
    assert not drawn[p == 0].any()

    def fit(probs: torch.Tensor) -> float:
        cells = probs * n >= 5  # the rare tokens pooled into one cell
        observed = [*drawn[cells].tolist(), int(drawn[~cells].sum())]
        expected = [*(probs[cells] * n).tolist(), float(probs[~cells].sum() * n)]
        if expected[-1] == 0:
            observed, expected = observed[:-1], expected[:-1]
        return float(chisquare(observed, [e * n / sum(expected) for e in expected]).pvalue)

    assert fit(p.double()) > 1e-3
    multinomial = torch.multinomial(p, n, replacement=True, generator=torch.Generator().manual_seed(2))
    table = torch.stack([drawn, torch.bincount(multinomial, minlength=60)])
    table = table[:, table.sum(0) > 0]
    assert chi2_contingency(table.numpy())[1] > 1e-3
    if sampling.temperature == 0.6:
        hotter = nucleus_logits(logits[None], 0.7, sampling.top_p, sampling.top_k).softmax(-1)[0]
        assert fit(hotter.double()) < 1e-3


def test_a_keyed_token_depends_only_on_its_seed_row_position_and_logits():
    """Row r of K rows draws what a sampler of row r's seed alone draws, in any order of positions; another
    position or seed draws differently; greedy is the argmax."""
    sampling = Sampling(1.0)
    logits = torch.randn(3, 500, generator=torch.Generator().manual_seed(3))
    rows = TokenSampler.for_request(sampling, 5, 3)
    forward = [[rows.token(r, p, logits[r]) for p in range(40)] for r in range(3)]
    seeds = row_seeds(5, 3)
    for r in range(3):
        alone = TokenSampler(sampling, [seeds[r]])
        assert [alone.token(0, p, logits[r]) for p in reversed(range(40))] == forward[r][::-1]
    assert len({tuple(f) for f in forward}) == 3 and len(set(forward[0])) > 20
    other_seed = TokenSampler.for_request(sampling, 6, 1)
    assert [other_seed.token(0, p, logits[0]) for p in range(40)] != forward[0]
    greedy = TokenSampler.for_request(Sampling(), None, 2)
    assert greedy.token(1, 7, logits[1]) == int(logits[1].argmax())
    with pytest.raises(ValueError, match="a sampled position is >= 0, got -1"):
        rows.token(0, -1, logits[0])


def test_sample_streams_depend_only_on_seed_and_row():
    assert row_seeds(7, 3)[:2] == row_seeds(7, 2) and row_seeds(7, 2) != row_seeds(8, 2)
    with pytest.raises(ValueError, match=r"seed must be None or an integer >= 0, got -1"):
        row_seeds(-1, 2)


def test_expert_mode_stops_once_every_start_marker_is_in_the_cache(demo):
    """trajectory_tokens=False (the action expert decodes the trajectory): no trajectory tokens, and each row's
    cache holds its reasoning and `<|traj_future_start|>` exactly as that row alone, replayed in one forward
    (`TextModel.extend`), holds them."""
    sampling, limits, tracer = Sampling(temperature=0.8, top_p=0.95), PlanLimits(12, 128), Tracer()
    n = len(demo.prompt)
    demo.model.setup_cache(n + limits.decode_positions, 3)
    logits = demo.model.prefill(demo.prompt)
    sampler = TokenSampler.for_request(sampling, 7, 3)
    plans = generate_plans(
        demo.model,
        logits,
        demo.vocab,
        sampler,
        limits,
        demo.cfg.eos_token_ids,
        tracer,
        trajectory_tokens=False,
    )
    lengths = [len(p.reasoning_token_ids) for p in plans]
    assert all(p.future_token_ids == [] for p in plans)
    assert demo.model.cache_len == n + max(lengths) + 1
    assert {s.name for s in tracer.spans} == {"reasoning_decode"}
    start = demo.vocab.marker("traj_future_start")
    rows = [(demo.model.cache.k[-1][i, :, : n + m + 1].clone(), demo.model.cache.v[0][i, :, : n + m + 1].clone())
            for i, m in enumerate(lengths)]  # fmt: skip
    for (k, v), plan in zip(rows, plans, strict=True):
        demo.model.setup_cache(n + limits.decode_positions, 1)
        demo.model.prefill(demo.prompt)
        demo.model.extend(torch.tensor([[*plan.reasoning_token_ids, start]]))
        assert demo.model.cache_len == k.shape[1]
        assert torch.allclose(demo.model.cache.k[-1][0, :, : k.shape[1]], k, atol=1e-5)
        assert torch.allclose(demo.model.cache.v[0][0, :, : k.shape[1]], v, atol=1e-5)

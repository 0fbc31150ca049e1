"""The MoE router and block: transformers' router (ties included), the block config's validation, and the
hardware-shaped block's features (placement, shared experts, biases) against a plain torch computation."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from alpamayo.checkpoint import Checkpoint
from alpamayo.config.builtin import builtin_config
from alpamayo.config.moe import MoEBlockConfig
from alpamayo.errors import CheckpointError, ConfigError
from alpamayo.numerics import max_abs_error
from alpamayo.text import TextModel
from alpamayo.text.moe.block import MoEBlock
from alpamayo.text.moe.router import TopKRouter
from tests.hf_checkpoints import rewrite_hub_layout, save_checkpoint, text_config

HIDDEN, EXPERTS = 32, 8


def block_config(**overrides) -> MoEBlockConfig:
    """A small block: hidden 32, 8 routed experts of width 24, top-2; `overrides` set placement and extras."""
    return MoEBlockConfig(
        hidden_size=HIDDEN, intermediate_size=24, num_routed_experts=EXPERTS, select_experts_k=2, **overrides
    )


def test_router_matches_transformers_including_ties():
    """Duplicated router rows tie exactly at the top-k boundary; the same experts must win as in transformers."""
    from transformers import Qwen3VLMoeTextConfig
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextTopKRouter

    g = torch.Generator().manual_seed(0)
    distinct = torch.randn(4, HIDDEN, generator=g)
    weight = distinct.repeat_interleave(2, 0)  # experts 2i and 2i+1 always score the same
    x = torch.randn(64, HIDDEN, generator=g)
    x[0] = 0  # all 8 experts tie
    for dtype in (torch.float32, torch.bfloat16):
        hf = Qwen3VLMoeTextTopKRouter(
            Qwen3VLMoeTextConfig(hidden_size=HIDDEN, num_experts=EXPERTS, num_experts_per_tok=3)
        ).to(dtype)
        hf.weight.data.copy_(weight)
        _, hf_scores, hf_ids = hf(x.to(dtype))
        scores, ids = TopKRouter(weight.to(dtype), 3)(x.to(dtype))
        assert torch.equal(ids, hf_ids)
        assert torch.equal(scores, hf_scores)
        assert scores.dtype == dtype


def test_router_rejects_k_outside_the_expert_count():
    with pytest.raises(ValueError, match=r"router top-k must be in \[1, 8\].*got 9"):
        TopKRouter(torch.zeros(EXPERTS, HIDDEN), 9)


# ---------------------------------------------------------------------------------------------- config
FULL_YAML = """
hidden_size: 2048
intermediate_size: 768
num_routed_experts: 8
select_experts_k: 2
num_slots: 4
expert_mapping: [3, 2, 1, 0, 0, 1, 2, 3]
num_shared_experts: 2
shared_expert_ids_to_slots: {8: [0, 1], 9: [2, 3]}
shared_expert_scale: 0.5
has_bias: false
"""


def test_block_config_loads_from_yaml(tmp_path):
    path = tmp_path / "moe.yaml"
    path.write_text(FULL_YAML)
    cfg = MoEBlockConfig.load(path)
    assert cfg.effective_k == 4 and cfg.experts_per_slot == 2
    assert cfg.storage_order == (3, 4, 2, 5, 1, 6, 0, 7)
    assert cfg.shared_expert_ids_to_slots == {8: (0, 1), 9: (2, 3)}
    assert cfg.shared_expert_scale == 0.5


def test_block_config_defaults_are_sequential_and_fully_replicated():
    cfg = MoEBlockConfig.from_yaml(
        "hidden_size: 64\nintermediate_size: 24\nnum_routed_experts: 8\nselect_experts_k: 2\n"
        "num_slots: 2\nexpert_mapping: sequential\nnum_shared_experts: 1\n"
        "shared_expert_ids_to_slots: fully_replicated\n"
    )
    assert cfg.expert_mapping == (0, 0, 0, 0, 1, 1, 1, 1)
    assert cfg.shared_expert_ids_to_slots == {8: (0, 1)}


def test_block_config_for_a_published_moe_model():
    cfg = MoEBlockConfig.for_text(builtin_config("qwen3-vl-30b-a3b").text)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_routed_experts, cfg.select_experts_k) == (
        2048,
        768,
        128,
        8,
    )
    assert cfg.num_slots == 1 and cfg.num_shared_experts == 0 and not cfg.has_bias


@pytest.mark.parametrize(
    "change, message",
    [
        ("num_slots: 3", r"num_routed_experts = 8 is not divisible by num_slots = 3"),
        (
            "expert_mapping: [0, 1, 2, 3, 4, 1, 2, -1]",
            r"expert_mapping\[4\] = 4, expert_mapping\[7\] = -1 out of range: slots are integers in "
            r"\[0, num_slots = 4\)",
        ),
        (
            "expert_mapping: [0, 0, 0, 1, 1, 2, 2, 3]",
            r"expert_mapping puts \[3, 2, 2, 1\] routed experts on slots 0..3",
        ),
        (
            "expert_mapping: [0, 1, 2, 3]",
            r"expert_mapping has 4 entries, expected one slot per routed expert",
        ),
        (
            "shared_expert_ids_to_slots: {0: [0, 1], 9: [2, 3]}",
            r"shared expert ids must be contiguous after the 8 routed ones: expected \[8, 9\], got \[0, 9\]",
        ),
        ("shared_expert_ids_to_slots: {8: [0, 1], 9: [2, 5]}", r"shared_expert_ids_to_slots\[9\] = \[2, 5\]"),
        (
            "shared_expert_ids_to_slots: {8: [0, 1], 9: [1, 2]}",
            r"shared_expert_ids_to_slots gives slots 0..3 \[1, 2, 1, 0\] shared experts",
        ),
        ("has_bias: true", r"has_bias = true cannot be combined with num_shared_experts = 2"),
        ("select_experts_k: 9", r"select_experts_k = 9 must be in \[1, num_routed_experts = 8\]"),
        ("hidden_size: 0", r"hidden_size must be an integer >= 1, got 0"),
        ("shared_expert_scale: .inf", r"shared_expert_scale must be a finite number, got inf"),
        ("num_experts: 8", r"unknown field\(s\) \['num_experts'\]; allowed: \['hidden_size'"),
    ],
)
def test_block_config_rejects_bad_fields_precisely(change, message):
    key = change.split(":")[0]
    lines = [ln for ln in FULL_YAML.strip().splitlines() if not ln.startswith(key + ":")]
    with pytest.raises(ConfigError, match=r"^moe\.yaml: " + message):
        MoEBlockConfig.from_yaml("\n".join([*lines, change]), "moe.yaml")


def test_block_config_rejects_missing_fields_and_non_mappings():
    with pytest.raises(ConfigError, match=r"missing field\(s\) \['intermediate_size'\]"):
        MoEBlockConfig.from_yaml("hidden_size: 8\nnum_routed_experts: 8\nselect_experts_k: 2")
    with pytest.raises(ConfigError, match=r"must be a YAML mapping, got list"):
        MoEBlockConfig.from_yaml("- 1")


# ---------------------------------------------------------------------------------------------- block
def random_weights(cfg: MoEBlockConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    e, s, h, i = cfg.num_routed_experts, cfg.num_shared_experts, cfg.hidden_size, cfg.intermediate_size
    w = {
        "gate_up": torch.randn(e, 2 * i, h, generator=g) / h**0.5,
        "down": torch.randn(e, h, i, generator=g) / i**0.5,
    }
    if s:
        w["shared_gate_up"] = torch.randn(s, 2 * i, h, generator=g) / h**0.5
        w["shared_down"] = torch.randn(s, h, i, generator=g) / i**0.5
    if cfg.has_bias:
        w["gate_up_bias"] = 0.1 * torch.randn(e, 2 * i, generator=g)
        w["down_bias"] = 0.1 * torch.randn(e, h, generator=g)
    return w


def random_routing(tokens: int, cfg: MoEBlockConfig, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores [T, k] summing to 1, distinct expert ids [T, k]) as a router would give."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack(
        [torch.randperm(cfg.num_routed_experts, generator=g)[: cfg.select_experts_k] for _ in range(tokens)]
    )
    scores = torch.rand(tokens, cfg.select_experts_k, generator=g) + 0.1
    return scores / scores.sum(-1, keepdim=True), ids


def plain_moe(cfg: MoEBlockConfig, w: dict, x: torch.Tensor, scores: torch.Tensor, ids: torch.Tensor):
    """The block's formula, one token and one expert at a time:
    y_t = sum_j scores[t, j] * f_{ids[t, j]}(x_t) + shared_expert_scale * sum_s f_s(x_t),
    f(x) = down (silu(gate x + b_gate) * (up x + b_up)) + b_down."""
    i = cfg.intermediate_size

    def expert(v, gate_up, down, gate_up_bias=0.0, down_bias=0.0):
        h = gate_up @ v + gate_up_bias
        return down @ (F.silu(h[:i]) * h[i:]) + down_bias

    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            bias = (w["gate_up_bias"][e], w["down_bias"][e]) if cfg.has_bias else ()
            out[t] += scores[t, j] * expert(x[t], w["gate_up"][e], w["down"][e], *bias)
        for s in range(cfg.num_shared_experts):
            out[t] += cfg.shared_expert_scale * expert(x[t], w["shared_gate_up"][s], w["shared_down"][s])
    return out


BLOCKS = {
    "shared-experts": dict(
        num_slots=4, expert_mapping=(3, 2, 1, 0, 0, 1, 2, 3), num_shared_experts=2, shared_expert_scale=0.5
    ),
    "biases": dict(num_slots=2, has_bias=True),
}


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_block_matches_the_plain_formula(name, record_figure):
    cfg = block_config(**BLOCKS[name])
    w = random_weights(cfg)
    block = MoEBlock(cfg, **w)
    x = torch.randn(9, HIDDEN, generator=torch.Generator().manual_seed(2))
    scores, ids = random_routing(9, cfg)
    expected = plain_moe(cfg, w, x, scores, ids)
    for rows, what in ((slice(0, 9), "prompt"), (slice(4, 5), "one token")):
        err = max_abs_error(expected[rows], block(x[rows], scores[rows], ids[rows]))
        record_figure(f"{what} max abs vs plain formula", err)
        assert err <= 1e-5


def test_expert_mapping_moves_experts_between_slots_not_results():
    sequential = block_config(num_slots=2)
    mapped = block_config(num_slots=2, expert_mapping=(1, 0, 1, 0, 1, 0, 1, 0))
    w = random_weights(sequential)
    x = torch.randn(12, HIDDEN, generator=torch.Generator().manual_seed(3))
    scores, ids = random_routing(12, sequential)
    block = MoEBlock(mapped, **w)
    assert torch.equal(MoEBlock(sequential, **w)(x, scores, ids), block(x, scores, ids))
    groups = block.dispatch(x, ids).groups
    slots = [mapped.expert_mapping[e] for e, _ in groups]
    assert slots == sorted(slots)  # slot 0's experts (odd ids) are grouped first
    assert [e for e, _ in groups] == sorted((e for e, _ in groups), key=lambda e: (e % 2 == 0, e))


def expert_calls(block: MoEBlock, run) -> list[tuple[int, int]]:
    """Run `run()` and return (expert id, rows) of every expert SwiGLU call, in call order."""
    calls: list[tuple[int, int]] = []
    hooks = [
        expert.register_forward_hook(lambda _m, args, _out, e=e: calls.append((e, len(args[0]))))
        for e, expert in zip(block.storage_ids, block.experts, strict=True)
    ]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return calls


@pytest.mark.parametrize("tokens", [1, 5])
def test_each_chosen_expert_runs_once_on_exactly_its_tokens(tokens):
    """One decoded token computes only its k experts (k of E read); a prompt runs each active expert once,
    on all the rows routed to it, and never an expert no token chose."""
    cfg = block_config()
    block = MoEBlock(cfg, **random_weights(cfg))
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(4))
    scores, ids = random_routing(tokens, cfg)
    calls = expert_calls(block, lambda: block(x, scores, ids))
    assert calls == [(e, int((ids == e).sum())) for e in ids.unique().tolist()]


def test_block_rejects_bad_routing_inputs():
    cfg = block_config()
    block = MoEBlock(cfg, **random_weights(cfg))
    x = torch.randn(3, HIDDEN)
    scores, ids = random_routing(3, cfg)
    with pytest.raises(ValueError, match=r"routed expert ids in \[0, 8\), got range \[\d, 8\]"):
        block(x, scores, torch.where(ids == ids[0, 0], 8, ids))
    with pytest.raises(
        ValueError, match=r"expert indices must be \[3, 2\] \(tokens, select_experts_k\), got \[3, 3\]"
    ):
        block(x, torch.ones(3, 3), torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"MoE block input must be \[tokens, 32\], got \[3, 31\]"):
        block(x[:, :31], scores, ids)


def test_block_rejects_weights_that_do_not_fit_its_config():
    cfg = block_config(num_shared_experts=1)
    w = random_weights(cfg)
    with pytest.raises(
        ValueError, match=r"'shared_down' \[1, 32, 24\] is required with num_shared_experts = 1"
    ):
        MoEBlock(cfg, w["gate_up"], w["down"], w["shared_gate_up"])
    with pytest.raises(ValueError, match=r"'gate_up_bias' was given but has_bias = False does not use it"):
        MoEBlock(cfg, **w, gate_up_bias=torch.zeros(EXPERTS, 48))
    with pytest.raises(ValueError, match=r"'down' has shape \[8, 24, 32\], expected \[8, 32, 24\]"):
        MoEBlock(cfg, **dict(w, down=w["down"].transpose(1, 2)))


def test_checkpoint_mixing_the_two_expert_layouts_is_refused(tmp_path):
    """Refused while validating, before any tensor is read (ttnn: before the device is opened), naming the
    tensors and their file."""
    save_checkpoint(tmp_path, text_config(), moe=True)
    assert rewrite_hub_layout(tmp_path, ("layers.1.mlp.experts.gate_up_proj",)) == 1
    ckpt = Checkpoint(tmp_path)
    with pytest.raises(
        CheckpointError,
        match=rf"^{re.escape(str(tmp_path))}: expert tensors of 'language_model.layers.1.mlp.experts' disagree "
        r"on the layout: gate_up_proj \[8, 64, 48\] is hub layout but down_proj \[8, 64, 24\] is v5 layout "
        r"\(E=8, hidden=64, moe_intermediate=24\); on disk: 'model.language_model.layers.1.mlp.experts."
        r"gate_up_proj' in model.safetensors, 'model.language_model.layers.1.mlp.experts.down_proj' in "
        r"model.safetensors$",
    ):
        TextModel.from_checkpoint(ckpt)
    assert ckpt._handles == {}  # no tensor was read

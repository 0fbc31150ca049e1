"""The action expert on one p150, planned on the CPU: its device tensors against the checkpoint's weight names,
the `expert` precision group, the DRAM budget with its KV region, the step plan, the stage estimates and
`alpamayo plan` for Alpamayo 1.5."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
import yaml

from alpamayo.cli import main
from alpamayo.config.builtin import CONFIG_DIR, EXPERT_SUFFIX, builtin_expert
from alpamayo.errors import ConfigError
from alpamayo.plan.dram import plan_memory, spec_bytes
from alpamayo.plan.estimate import expert_estimate
from alpamayo.plan.expert_weights import expert_weight_specs
from alpamayo.plan.precision import PRESETS, TENSOR_GROUPS, Precision
from alpamayo.plan.programs.expert import plan_expert
from alpamayo.plan.programs.grid import PlanError
from alpamayo.plan.programs.text import TextPlan
from alpamayo.plan.weights import prepare, restore, weight_dtype

RELEASE = "alpamayo-1.5-10b"


@pytest.fixture(scope="module")
def release():
    return builtin_expert(RELEASE)


def test_expert_specs_read_every_checkpoint_tensor_once_in_its_shape(release):
    """The device tensors consume exactly the expert's tensors on disk (ExpertConfig.weight_shapes), each in
    its shape, and restore them exactly (so QuantizedCheckpoint can round them as the device holds them)."""
    _, expert = release
    shapes = expert.weight_shapes()
    specs = expert_weight_specs(expert)
    read = {name for spec in specs for name in spec.sources}
    assert read == set(shapes)
    small = replace(expert, text=replace(expert.text, num_hidden_layers=1))
    gen = torch.Generator().manual_seed(0)
    tensors = {name: torch.randn(shape, generator=gen) for name, shape in small.weight_shapes().items()}
    for spec in expert_weight_specs(small):
        back = restore(spec, prepare(spec, tensors.__getitem__))
        for name, t in back.items():
            assert torch.equal(t.reshape(tensors[name].shape), tensors[name]), spec.name


def test_expert_linears_are_in_the_expert_group_and_count_the_released_parameters(release, record_figure):
    _, expert = release
    linears = [s for s in expert_weight_specs(expert) if s.group == "expert"]
    params = sum(math.prod(s.shape) for s in linears)
    record_figure("expert linear parameters", params)
    # 2.2806 B parameters in all (audit B.3), of which norms 36 x 2 x (2048 + 128) + 2048 + 1024 + 4096 + 2 ...
    assert params == sum(
        math.prod(shape) for name, shape in expert.weight_shapes().items() if len(shape) == 2
    )
    assert 2.28e9 < params < 2.281e9


def test_presets_put_the_expert_in_bfp8_and_a_recipe_can_choose_bfp4():
    assert "expert" in TENSOR_GROUPS
    assert PRESETS["performance"].dtype("expert") == "bfp8"
    assert PRESETS["performance"].math_fidelity("expert") == "hifi2"
    assert PRESETS["accuracy"].math_fidelity("expert") == "hifi4"
    mine = Precision.from_dict({"base": "performance", "dtypes": {"expert": "bfp4"}}, "mine")
    assert mine.dtype("expert") == "bfp4" and mine.dtype("qkv") == "bfp8"


@pytest.mark.parametrize("recipe", ["accuracy", "performance"])
def test_the_expert_adds_its_weights_kv_region_and_trace_to_the_dram_budget(release, recipe):
    cfg, expert = release
    precision = PRESETS[recipe]
    alone = plan_memory(replace(cfg, extra={}), precision, 4096)  # no expert fields: the VLM alone
    both = plan_memory(cfg, precision, 4096, samples=3)  # the config's own expert, sample b in cache slot b
    specs = expert_weight_specs(expert)
    assert both.weights["expert"] == sum(
        spec_bytes(s, weight_dtype(s, precision)) for s in specs if s.group == "expert"
    )
    assert both.weight_bytes - alone.weight_bytes == sum(
        spec_bytes(s, weight_dtype(s, precision)) for s in specs
    )
    step = plan_expert(cfg, expert, precision, 4096, samples=3)
    assert step.rows == 192 and step.cache_rows == TextPlan.cache_length(4096 + 64)
    assert both.kv_cache / alone.kv_cache == 3 * step.cache_rows / TextPlan.cache_length(4096)
    assert both.trace_region == alone.trace_region + step.trace_region_bytes
    assert both.fits


def test_the_step_plan_puts_the_expert_region_at_the_cache_tail_on_whole_tiles(release):
    cfg, expert = release
    for samples in (1, 3, 16):
        plan = plan_expert(cfg, expert, PRESETS["performance"], 3000, samples)
        assert plan.region_rows == 64 and plan.rows == 64 * samples  # one 64-row region per cache slot
        assert plan.region_start + plan.region_rows == plan.cache_rows
        assert plan.region_start >= 3000 and plan.region_start % 32 == 0
        assert plan.rows % 32 == 0 and plan.cache_rows % plan.k_chunk == 0
        assert plan.region_start % plan.region_rows == 0  # the own region is one whole page


def test_an_expert_that_cannot_read_the_vlm_cache_is_refused_naming_both(release):
    cfg, expert = release
    other = replace(expert, text=replace(expert.text, num_hidden_layers=12))
    with pytest.raises(ConfigError, match="the action expert has 12 layers but the VLM has 36"):
        plan_expert(cfg, other, PRESETS["performance"], 4096)
    with pytest.raises(PlanError, match=r"samples = 0: the device expert runs 1..16"):
        plan_expert(cfg, expert, PRESETS["performance"], 4096, samples=0)


def test_an_attention_the_flash_decode_cannot_hold_is_refused_naming_the_limit(release):
    """One K/V head's query rows (64 x query heads per K/V head) must fit one flash-decode user's 8 tiles, and
    every slot's K/V heads need a core each: 16 samples x 8 heads on a 120-core grid do not fit."""
    from alpamayo.plan.device_spec import P150

    cfg, expert = release
    narrow = replace(cfg, text=replace(cfg.text, num_key_value_heads=2))
    wide = replace(expert, text=replace(expert.text, num_key_value_heads=2))
    with pytest.raises(PlanError, match=r"8 query heads per K/V head.*at most 4 query heads per K/V head"):
        plan_expert(narrow, wide, PRESETS["performance"], 4096)
    with pytest.raises(PlanError, match=r"samples = 16: .* 16 x 8 of them on 120 cores; at most 15 samples"):
        plan_expert(cfg, expert, PRESETS["performance"], 4096, samples=16, device=replace(P150, grid_x=12))
    assert plan_expert(cfg, expert, PRESETS["performance"], 4096, samples=15, device=replace(P150, grid_x=12))


@pytest.mark.parametrize("samples", [1, 3])
@pytest.mark.parametrize("max_seq_len", [256, 3000, 8192])
def test_each_user_sees_exactly_its_own_region_and_its_slots_prefix(release, max_seq_len, samples):
    """The flash-decode's view against the attention's semantics: user s x n_kv + g reads logical position p
    from row p % 64 of page page_table[u][p // 64] of the paged cache [slots x n_kv x pages, 1, 64, hd]
    (the same tiles as [slots, n_kv, cache_rows, hd]) for p <= cur_pos(offset). Those rows are exactly its
    slot's and K/V head's own region and prefix [0, offset), each once (offset 0: an idle slot), and the
    chunks read are those positions' (`attended_rows`)."""
    cfg, expert = release
    plan = plan_expert(cfg, expert, PRESETS["performance"], max_seq_len, samples)
    table, n_kv, page = plan.page_table(), plan.kv_heads, plan.region_rows
    assert len(table) == plan.users == samples * n_kv and {len(r) for r in table} == {plan.pages}
    for offset in sorted({0, 1, 63, 64, 65, 127, 128, max_seq_len // 2, max_seq_len - 1, max_seq_len}):
        for user, pages in enumerate(table):
            seen = []
            for p in range(plan.cur_pos(offset) + 1):
                flat = pages[p // page] * page + p % page  # row of [slots x n_kv x cache_rows]
                seen.append(divmod(flat, plan.cache_rows))
            heads = {h for h, _ in seen}
            expected = [*range(plan.region_start, plan.cache_rows), *range(offset)]
            assert heads == {user} and sorted(r for _, r in seen) == sorted(expected)
        assert plan.attended_rows(offset) == -(-(offset + page) // plan.k_chunk) * plan.k_chunk


def test_expert_step_estimate_counts_every_matmul_and_the_attention_over_the_cache(release, record_figure):
    """FLOPs and bytes from the config's dimensions (audit B.11: ~351 GFLOP per step at a 3.1k prompt); the
    attention over its own region and a 3136-row prefix, 3200 keys: 25 chunks of 128, in an 8k cache or a
    4k one alike."""
    cfg, expert = release
    t = expert.text
    step = expert_estimate(cfg, expert, PRESETS["performance"], 8192, 1, 3136)
    plan = plan_expert(cfg, expert, PRESETS["performance"], 8192, 1)
    assert (plan.k_chunk, plan.q_tiles, plan.users, plan.attended_rows(3136)) == (128, 4, 8, 25 * 128)
    small = plan_expert(cfg, expert, PRESETS["performance"], 4096, 1)
    assert small.attended_rows(3136) == 25 * 128
    inter = 8256  # a whole number of tiles: the expert's weights are interleaved, not padded to the banks
    per_layer = t.hidden_size * (t.q_dim + 2 * t.kv_dim) + t.q_dim * t.hidden_size + 3 * t.hidden_size * inter
    in_proj = 64 * 512 + 512 * 512 + 512 * 2048
    linear = 2 * 64 * (t.num_hidden_layers * per_layer + in_proj + 2048 * 32)
    attention = 4 * 64 * 25 * 128 * t.num_attention_heads * t.head_dim * t.num_hidden_layers
    assert step.flops() == pytest.approx(linear + attention)
    record_figure("expert step GFLOP (K=1)", step.flops() / 1e9)
    from alpamayo.plan.device_spec import P150

    record_figure("expert step estimated ms (performance, K=1)", step.ms(P150))
    assert step.repeat == expert.num_inference_steps == 10
    # K = 1 reads ~2.4 GB of bfp8 weights per step: its matmuls are bound by DRAM, not by the 64 rows'
    # compute; its attention's 8 users (K/V heads) split the keys over 16 cores each, the 130-core grid's 128,
    # and read the K/V faster than 32 cores (a prefill-style SDPA's 16 heads x 2 Q chunks) would compute it
    sdpa = [op for op in step.ops if ".sdpa." in op.name]
    assert {op.cores for op in sdpa} == {128}
    assert all(op.bound(P150) == "DRAM" for op in sdpa)
    assert all(replace(op, cores=32).bound(P150) == "compute" for op in sdpa)
    assert all(op.bound(P150) == "DRAM" for op in step.ops if ".sdpa." not in op.name and op.dram_bytes > 1e6)
    # K = 16: 1024 rows make the matmuls compute-bound; each sample reads its own slot's K/V
    big = expert_estimate(cfg, expert, PRESETS["performance"], 8192, 16, 3136)
    assert all(op.bound(P150) == "compute" for op in big.ops if ".layers." in op.name)
    assert [op.dram_bytes for op in big.ops if ".sdpa." in op.name] == [16 * op.dram_bytes for op in sdpa]


def test_plan_cli_prints_the_alpamayo_1_5_budget_fit_and_estimates(capsys):
    assert main(["plan", "--checkpoint", RELEASE, "--max-seq-len", "4096"]) == 0
    out = capsys.readouterr().out
    assert "action expert with 1 sample(s), recipe 'performance', max_seq_len 4096" in out
    assert "weights expert" in out
    assert "presets that fit on one Blackhole p150: accuracy (" in out and "performance (" in out
    assert "p150 TIME PER STAGE: the roofline" in out and "16 images 320x576, prompt 3072 tokens" in out
    assert "expert step (K=1)" in out and "x 10 =" in out
    assert "expert attention: paged flash-decode over the VLM cache in place" in out


def test_plan_cli_names_a_bad_image_size(capsys):
    assert main(["plan", "--checkpoint", RELEASE, "--image-size", "320by576"]) == 2
    assert "--image-size '320by576': expected HEIGHTxWIDTH" in capsys.readouterr().err


def test_device_fourier_tables_give_the_in_projections_features(release):
    """The device's feature recipe (x * freq rows in float32, frac, phase, sin, sqrt(2), plus the step's t row)
    on the tables `feature_rows` / `t_feature_rows` build equals the torch in-projection's own features for
    |f x| up to ~500, where a bf16 or 10-bit-mantissa product of x and f would already be off by a radian."""
    from alpamayo.expert.in_proj import ActionInProj, default_freqs
    from alpamayo.tt.expert import feature_rows, t_feature_rows

    _, expert = release
    c = expert.in_proj
    freqs = [default_freqs(c)] * 3
    in_proj = ActionInProj(freqs, [(torch.zeros(1, c.num_features), torch.zeros(1))], [], (None, None))
    x = torch.randn(3, 64, 2, generator=torch.Generator().manual_seed(0)) * 2.5
    tables = feature_rows(c, freqs)
    for k, t_row in enumerate(t_feature_rows(c, freqs, 10)):
        u = x[..., :1] * tables.freq_a[0, 0] + x[..., 1:] * tables.freq_k[0, 0]
        device = math.sqrt(2) * torch.sin(2 * math.pi * (torch.frac(u) + tables.phase[0, 0])) + t_row[0, 0]
        reference = in_proj.features(x, torch.full((3,), k / 10))
        assert device.shape[-1] == 64 and torch.equal(device[..., 60:], torch.zeros(3, 64, 4))
        # both round the float32 argument: one ulp of 2 pi f x at |2 pi f x| ~ 3000 rad is 2.4e-4
        assert (device[..., :60] - reference).abs().max() < 1e-3, k


@pytest.mark.parametrize("base", ["nvidia/Cosmos-Reason2-8B", "Qwen/Qwen3-VL-8B-Instruct", "Org/Other-8B"])
def test_plan_on_a_release_directory_needs_no_base_model_on_disk(base, tmp_path, monkeypatch, capsys):
    # A released 1.5 config.json (flat, with the vocab_size NVIDIA's config saves), no base model anywhere:
    # the hub cache is empty and nothing is downloaded.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    fields = yaml.safe_load((CONFIG_DIR / f"{RELEASE}{EXPERT_SUFFIX}").read_text())
    release = tmp_path / RELEASE  # the model name printed comes from the directory name
    release.mkdir()
    config = {**fields["config"], "vlm_name_or_path": base, "vocab_size": fields["vocab_size"]}
    (release / "config.json").write_text(json.dumps(config))
    assert main(["plan", "--checkpoint", RELEASE, "--max-seq-len", "4096"]) == 0
    builtin = capsys.readouterr().out
    code = main(["plan", "--checkpoint", str(release), "--max-seq-len", "4096"])
    printed = capsys.readouterr()
    if base == "Org/Other-8B":  # an unknown base still has to be on disk: its shapes are not known here
        assert code == 2 and "base model 'vlm_name_or_path' = 'Org/Other-8B' not found" in printed.err
        return
    assert code == 0, printed.err
    assert printed.out == builtin

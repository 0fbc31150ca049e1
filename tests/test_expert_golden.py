"""The action expert against an HF-composed reference built the way NVIDIA's Alpamayo 1.5 code builds it.

Reference: transformers' `Qwen3VLTextModel` with the expert's overrides (`ExpertConfig.text_dict`), fed
`inputs_embeds` from NVIDIA's `PerWaypointActionInProjV2` maths (written out below with torch.nn modules named
as NVIDIA's), 3-row `position_ids`, the 4-D float mask and the VLM's own `DynamicCache` from transformers'
prefill (with an image, so rope_delta != 0) and token-by-token generation of K rows with different reasoning
lengths, appended and cropped per step (`step_fn`); the Euler loop is `FlowMatching._euler`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Qwen3VLMoeTextConfig, Qwen3VLMoeTextModel, Qwen3VLTextConfig, Qwen3VLTextModel

from alpamayo.backends import BackendOptions, load_expert_decoder
from alpamayo.checkpoint import Checkpoint
from alpamayo.config.expert import InProjConfig, parse_expert_config
from alpamayo.config.flow import FlowSettings
from alpamayo.config.loader import load_model_config
from alpamayo.errors import CheckpointError, ConfigError
from alpamayo.expert.decoding import ExpertDecoder, replayed_tokens, unguided_prompt
from alpamayo.expert.demo import random_expert_weights
from alpamayo.expert.in_proj import default_freqs, fourier_features
from alpamayo.expert.sampler import check_noise, euler_sample
from alpamayo.expert.weights import load_expert
from alpamayo.numerics import assert_agrees, max_abs_error, pcc
from alpamayo.vlm import VisionLanguageModel
from planner.action_space import UnicycleActionSpace
from planner.plans import GeneratedPlan
from tests.hf_checkpoints import (
    IMAGE_VISION,
    TOKEN_IDS,
    image_reference,
    load_hf,
    save_checkpoint,
    text_config,
)

VLM_TEXT = text_config(vocab_size=320, num_hidden_layers=3)
EXPERT_RAW = {
    # 6 query heads over the VLM's 2 KV heads (GQA 3:1), its own hidden and MLP widths
    "expert_cfg": {"hidden_size": 48, "num_attention_heads": 6, "intermediate_size": 80},
    "action_in_proj_cfg": {
        "num_enc_layers": 2,
        "hidden_size": 32,
        "num_fourier_feats": 20,
        "max_freq": 100.0,
    },
    "action_out_proj_cfg": {"_target_": "torch.nn.Linear"},
    "diffusion_cfg": {"int_method": "euler", "num_inference_steps": 10},
    "expert_non_causal_attention": True,
}
ROUTE_START, ROUTE_END, TRAJ_START, FILLER = 300, 301, 302, 303  # ids past the test tokenizer's tokens
REASONING = [[65, 66, 67], [70, 71, 72, 73, 74, 75], [80, 81, 82, 83]]  # K = 3 rows of unequal length
N_TOKENS = 64
K = len(REASONING)
OUT_SCALE = 0.02
BF16_VELOCITY_PCC, BF16_XYZ_M = 0.9999, 4e-3  # derived in test_bfloat16_figures


def plans() -> list[GeneratedPlan]:
    return [GeneratedPlan(list(r), False, np.zeros(0, np.int64), []) for r in REASONING]


def route_prompt(ids: torch.Tensor) -> torch.Tensor:
    """The image prompt with a navigation span before its final `<|im_end|>` (the guided prompt)."""
    end = int((ids == TOKEN_IDS["<|im_end|>"]).nonzero()[0])
    return torch.cat([ids[:end], torch.tensor([ROUTE_START, *b"turn left", ROUTE_END]), ids[end:]])


class RefRMSNorm(nn.Module):
    """NVIDIA's action_in_proj.RMSNorm: normalise in float32, cast back, multiply by the weight."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight


class RefInProj(nn.Module):
    """PerWaypointActionInProjV2 (2 encoder layers), module names as NVIDIA's; freqs built as bfloat16."""

    def __init__(self, c: InProjConfig, hidden: int):
        super().__init__()
        self.encoder = nn.Module()
        h = c.hidden_size
        self.encoder.trunk = nn.Sequential(
            nn.Linear(c.num_features, h), nn.SiLU(), RefRMSNorm(h), nn.Linear(h, h), nn.SiLU(), RefRMSNorm(h),
            nn.Linear(h, hidden),
        )  # fmt: skip
        self.norm = nn.LayerNorm(hidden)
        self.freqs = torch.logspace(0, math.log10(c.max_freq), c.num_freqs, dtype=torch.bfloat16)[None]

    def fe(self, u):
        arg = u[..., None] * self.freqs * 2 * torch.pi
        return torch.cat([torch.sin(arg), torch.cos(arg)], -1) * math.sqrt(2)

    def forward(self, x, t):
        b, n, _ = x.shape
        feats = torch.cat([self.fe(x[:, :, 0]), self.fe(x[:, :, 1])], -1)
        feats = torch.cat([feats, self.fe(t[..., -1]).repeat(1, n, 1)], -1)
        out = self.encoder.trunk(feats.flatten(0, 1).to(self.norm.weight.dtype)).reshape(b, n, -1)
        return self.norm(out)


def sub_state(weights: dict, prefix: str) -> dict:
    return {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}


class HFExpert:
    """NVIDIA's composition: in-proj, Qwen3VLTextModel over the prompt cache (append, then crop), out-proj; the
    tensors under the layout's names (`cfg.prefixes`: 1.5's `expert.*`, Super's `expert.expert.*`)."""

    def __init__(self, cfg, weights: dict, dtype: torch.dtype):
        # NVIDIA's flat layout copies the VLM's text config: an MoE VLM's copy builds an MoE text model
        moe = cfg.text.moe is not None
        model_cls, config_cls = (
            (Qwen3VLMoeTextModel, Qwen3VLMoeTextConfig) if moe else (Qwen3VLTextModel, Qwen3VLTextConfig)
        )
        self.model = model_cls(config_cls(**cfg.text_dict))
        del self.model.embed_tokens
        prefixes = cfg.prefixes
        state = sub_state(weights, prefixes.expert)
        for name in [n for n in state if n.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))]:
            state[name] = state[name].transpose(1, 2)  # the released hub layout -> transformers 5's modules
        self.model.load_state_dict(state)
        self.in_proj = RefInProj(cfg.in_proj, cfg.text.hidden_size)
        self.in_proj.load_state_dict(sub_state(weights, prefixes.in_proj))
        self.out_proj = nn.Linear(cfg.text.hidden_size, 2)
        self.out_proj.load_state_dict(sub_state(weights, prefixes.out_proj))
        inv_freq = self.model.rotary_emb.inv_freq.clone()
        for m in (self.model, self.in_proj, self.out_proj):
            m.to(dtype).eval()
        # as from_pretrained(dtype=...) keeps it: the rotary table stays float32 (`.to` would round it)
        self.model.rotary_emb.inv_freq = inv_freq
        self.dtype = dtype

    @torch.no_grad()
    def step(self, x, t, cache, position_ids, mask):
        prefill = cache.get_seq_length()
        e = self.in_proj(x, t)
        out = self.model(
            inputs_embeds=e, position_ids=position_ids, past_key_values=cache, attention_mask=mask,
            use_cache=True, is_causal=False,
        )  # fmt: skip
        cache.crop(prefill - cache.get_seq_length())  # transformers 5: a negative count removes tokens
        return self.out_proj(out.last_hidden_state[:, -N_TOKENS:]).view(-1, N_TOKENS, 2)


def expert_inputs(offsets, rope_delta, kv_len, dtype):
    """NVIDIA's `_build_expert_pos_ids_and_attn_mask` (no prompt padding)."""
    rows = len(offsets)
    pos = torch.arange(N_TOKENS).repeat(3, rows, 1) + (rope_delta + torch.tensor(offsets))[None, :, None]
    mask = torch.zeros(rows, 1, N_TOKENS, kv_len + N_TOKENS, dtype=dtype)
    for i, off in enumerate(offsets):
        mask[i, :, :, off:-N_TOKENS] = torch.finfo(dtype).min
    return pos, mask


@torch.no_grad()
def hf_cache(hf, ids, hf_inputs, feed, step_by_step: bool):
    """transformers' prefill of ids, repeated for the K rows, then the rows' tokens `feed` [K, n]: one token at
    a time (generation) or in one forward with explicit cache positions (NVIDIA's unguided replay)."""
    hf.model.rope_deltas = None
    cache = hf(input_ids=ids.view(1, -1), **hf_inputs, use_cache=True).past_key_values
    cache.batch_repeat_interleave(feed.shape[0])
    length = ids.numel()
    chunks = [feed[:, i : i + 1] for i in range(feed.shape[1])] if step_by_step else [feed]
    for chunk in chunks:
        pos = torch.arange(cache.get_seq_length(), cache.get_seq_length() + chunk.shape[1])
        hf(input_ids=chunk, past_key_values=cache, use_cache=True, cache_position=pos)
    return cache, int(hf.model.rope_deltas.reshape(-1)[0]), length


def hf_euler(step, noise, steps):
    """FlowMatching._euler with a given initial noise."""
    x, ts = noise.clone(), torch.linspace(0.0, 1.0, steps + 1)
    b = x.shape[0]
    for i in range(steps):
        dt = (ts[i + 1] - ts[i]).view(1, 1, 1).expand(b, 1, 1)
        x = x + dt * step(x, ts[i].view(1, 1, 1).expand(b, 1, 1))
    return x


def build_golden(path, moe: bool = False) -> dict:
    """A tiny VLM checkpoint (MoE with `moe`) with a random flat-layout expert in its safetensors, whose config
    copies the VLM's text config as written (`raw_text_config`), and the HF reference of its image prompt."""
    hf = save_checkpoint(path, VLM_TEXT, vision=IMAGE_VISION, moe=moe)
    vlm = load_model_config(path)
    cfg = parse_expert_config(EXPERT_RAW, vlm.raw_text_config, vlm_kind=vlm.kind)
    weights = random_expert_weights(cfg, seed=3)
    # Random weights make the flow field chaotic: a float32 rounding difference of 1.7e-7 in x grew 80x per
    # Euler step (the 2 pi 100 Fourier frequency, then an expanding random MLP), 0.7 after 10 steps. A smaller
    # out-projection makes the field about as smooth in x as a trained one, so 10-step results stay comparable.
    weights["action_out_proj.weight"] *= OUT_SCALE
    tensors = load_file(path / "model.safetensors")
    save_file({**tensors, **weights}, path / "model.safetensors", metadata={"format": "pt"})
    case = image_reference(hf)
    guided_ids = route_prompt(case["ids"])
    return dict(path=path, hf=hf, cfg=cfg, weights=weights, case=case, guided_ids=guided_ids)


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    return build_golden(tmp_path_factory.mktemp("expert") / "ckpt")


class Run:
    """One dtype's pair: ours (VLM wrapper + expert) and the HF composition, after the same reasoning."""

    def __init__(self, g, dtype: torch.dtype):
        case, hf = g["case"], g["hf"] if dtype == torch.float32 else load_hf(g["path"], dtype)
        self.vlm = VisionLanguageModel.from_checkpoint(g["path"], BackendOptions(dtype=dtype))
        self.expert = load_expert(g["path"], g["cfg"], self.vlm.config.text, dtype)
        self.hf_expert = HFExpert(g["cfg"], g["weights"], dtype)
        pixels, grid = case["hf_inputs"]["pixel_values"], case["hf_inputs"]["image_grid_thw"]
        self.features = self.vlm.encode_pixels(pixels.to(dtype), grid)
        ids = g["guided_ids"]
        hf_inputs = dict(case["hf_inputs"], pixel_values=pixels.to(dtype))
        hf_inputs["mm_token_type_ids"] = (ids == TOKEN_IDS["<|image_pad|>"]).to(torch.int32).view(1, -1)
        self.replay = replayed_tokens(plans(), TRAJ_START, FILLER)
        feed = self.replay[:, :-1]  # generation feeds n tokens; the last generated one never enters the cache
        self.ids, self.hf_inputs, self.dtype = ids, hf_inputs, dtype
        self.cache, delta, length = hf_cache(hf, ids, hf_inputs, feed, step_by_step=True)
        self.offsets = [length + len(r) + 1 for r in REASONING]
        self.pos, self.mask = expert_inputs(self.offsets, delta, self.cache.get_seq_length(), dtype)
        self.vlm.setup_cache(ids.numel() + feed.shape[1] + 8, max_batch=len(REASONING))
        self.vlm.prefill_hidden(ids, self.features)
        self.vlm.fork(len(REASONING))
        for i in range(feed.shape[1]):
            self.vlm.decode(feed[:, i])
        self.decoder = ExpertDecoder(self.expert)
        self.ctx = self.decoder.context(self.vlm.text, ids.numel(), plans())
        self.hf = hf

    def hf_step(self, x, t):
        return self.hf_expert.step(x, t, self.cache, self.pos, self.mask)


@pytest.fixture(scope="module")
def fp32(golden):
    return Run(golden, torch.float32)


@pytest.fixture(scope="module")
def bf16(golden):
    return Run(golden, torch.bfloat16)


def noise(rows: int = K, seed: int = 0):
    return torch.randn(rows, N_TOKENS, 2, generator=torch.Generator().manual_seed(seed))


def xyz(actions: torch.Tensor) -> np.ndarray:
    """The project's unicycle rollout of normalised actions (same v0 and z0 for every comparison)."""
    space = UnicycleActionSpace()
    return np.stack(
        [space.rollout(space.denormalise(a.double().numpy()), v0=8.0, z0=0.1)[0] for a in actions]
    )


def test_context_positions_and_offsets_follow_the_vlm(fp32):
    assert fp32.ctx.offsets.tolist() == fp32.offsets
    assert fp32.vlm.text.rope_delta == int(fp32.pos[0, 0, 0]) - fp32.offsets[0] < 0
    assert torch.equal(fp32.ctx.positions, fp32.pos[0])
    # the expert views the VLM cache rows in place
    assert fp32.ctx.keys[0].data_ptr() == fp32.vlm.text.cache.k[0].data_ptr()


def velocity_against_hf(run: Run, t: float, record_figure, label: str = "") -> tuple[float, float]:
    """(PCC, max abs) of our velocity at time t against the HF composition's, both recorded as figures."""
    x = noise(seed=1)
    tt = torch.full((len(REASONING),), t)
    expected = run.hf_step(x, tt.view(-1, 1, 1))
    actual = run.expert.velocity(x, tt, run.ctx)
    p, err = pcc(expected, actual), max_abs_error(expected, actual)
    record_figure(f"{label}velocity t={t} fp32 PCC", p)
    record_figure(f"{label}velocity t={t} fp32 max abs", err)
    return p, err


@pytest.mark.parametrize("t", [0.0, 0.3, 0.9])
def test_velocity_float32_matches_hf_composed(fp32, t, record_figure):
    p, err = velocity_against_hf(fp32, t, record_figure)
    assert p >= 0.99999 and err <= 1e-4


def test_ten_step_sampling_float32_pred_xyz_within_1e4_m(fp32, record_figure):
    x0 = noise(seed=2)
    expected = hf_euler(fp32.hf_step, x0, 10)
    actual = fp32.decoder.sample(fp32.ctx, noise=x0)
    err = float(np.abs(xyz(expected) - xyz(actual)).max())
    record_figure("10-step pred_xyz fp32 max abs (m)", err)
    record_figure("10-step actions fp32 max abs", max_abs_error(expected, actual))
    assert err <= 1e-4


def test_bfloat16_figures(bf16, record_figure):
    """bf16 against the bf16 HF composition, bounds near the figures measured on 10 noise draws x t in
    {0, 0.5, 0.9} (this module's `Run` over `noise(seed)` for seeds 0-9, on x86 CPU): velocity PCC 0.999982-0.999989, relative error
    4.3e-3-5.3e-3, max abs 4.9e-4-9.8e-4, |v| < 0.092; 10-step pred_xyz max abs 0.65e-3-2.55e-3 m.

    Margins: velocities lie in [2^-4, 2^-3), where one bf16 ulp is 2^-11 = 4.9e-4, so the worst measured is
    2 ulps and the bound is 4 (2^-9); relative error <= 2^-7 (1.5x the worst draw, 2 ulps of bf16's 8-bit
    significand); 1 - PCC <= 1e-4 (5x the worst 1.8e-5); pred_xyz <= 4e-3 m (1.5x the worst draw: the flow's
    10 steps amplify one rounding differently per draw, so the draws' spread, not one draw, sets the margin).
    """
    x = noise(seed=1)
    tt = torch.full((len(REASONING),), 0.5)
    got = assert_agrees(
        bf16.hf_step(x, tt.view(-1, 1, 1)),
        bf16.expert.velocity(x, tt, bf16.ctx),
        min_pcc=BF16_VELOCITY_PCC,
        max_relative=2**-7,
        max_abs=2**-9,
        what="bf16 velocity at t = 0.5",
    )
    record_figure("velocity t=0.5 bf16 PCC", got.pcc)
    record_figure("velocity t=0.5 bf16 max abs", got.max_abs)
    record_figure("velocity t=0.5 bf16 relative error", got.relative)
    x0 = noise(seed=2)
    ours = bf16.decoder.sample(bf16.ctx, noise=x0)
    err = float(np.abs(xyz(hf_euler(bf16.hf_step, x0, 10)) - xyz(ours)).max())
    record_figure("10-step pred_xyz bf16 max abs (m)", err)
    assert err <= BF16_XYZ_M
    # NVIDIA's Euler loop driven by our own bf16 velocity gives our sampling bit for bit: its [K, 1, 1] float32
    # dt promotes dt * v to float32 before the float32 accumulation. A 0-dim dt keeps the product in bf16
    # (the rounding alone moves pred_xyz by 1e-3-5e-3 m, inside the bf16 forward's own spread above, so only
    # this exact comparison sees it).
    own = hf_euler(lambda x, t: bf16.expert.velocity(x, t.reshape(-1), bf16.ctx), x0, 10)
    assert own.dtype == ours.dtype == torch.float32
    assert torch.equal(own, ours), f"max abs {max_abs_error(own, ours)}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_runtimes_expert_decoder_matches_hf_composed(golden, fp32, bf16, dtype, record_figure):
    """The decoder `AlpamayoVLA.from_checkpoint` builds (`backends.load_expert_decoder`, with the runtime's
    64 waypoints) samples what the HF composition of the checkpoint's raw tensors samples. The other runtime
    tests compare the expert only with itself (node vs direct call, Ray vs in-process), so a loader that
    mangled a weight would pass them; this one reads the expert through the runtime's own entry point."""
    run = fp32 if dtype == torch.float32 else bf16
    cfg = load_model_config(golden["path"])
    cfg = replace(
        cfg, extra={**cfg.extra, **EXPERT_RAW}
    )  # the expert's keys, as an Alpamayo config holds them
    decoder = load_expert_decoder(Checkpoint(golden["path"]), cfg, BackendOptions(dtype=dtype), run.vlm.text)
    x0 = noise(seed=8)
    actual = decoder.sample(decoder.context(run.vlm.text, run.ids.numel(), plans()), noise=x0)
    err = float(np.abs(xyz(hf_euler(run.hf_step, x0, 10)) - xyz(actual)).max())
    record_figure(f"runtime decoder 10-step pred_xyz {dtype} max abs (m)", err)
    # fp32: as test_ten_step_sampling_float32_pred_xyz_within_1e4_m; bf16: test_bfloat16_figures' bound
    assert err <= (1e-4 if dtype == torch.float32 else BF16_XYZ_M)


def test_k_rows_batched_equal_single_runs(golden, fp32, record_figure):
    """Each row of the batched sampling equals that trace run alone (prefill, its own tokens, its noise)."""
    x0 = noise(seed=4)
    batched = fp32.decoder.sample(fp32.ctx, noise=x0)
    worst = 0.0
    # A VLM of its own: the shared fixture's cache stays as the other tests expect it, whatever the order.
    vlm = VisionLanguageModel.from_checkpoint(golden["path"], BackendOptions(dtype=torch.float32))
    for i in range(len(REASONING)):
        vlm.setup_cache(fp32.ids.numel() + fp32.replay.shape[1] + 8, max_batch=1)
        vlm.prefill_hidden(fp32.ids, fp32.features)
        vlm.fork(1)
        for token in fp32.replay[i, : len(REASONING[i]) + 1]:
            vlm.decode(token.view(1))
        ctx = fp32.decoder.context(vlm.text, fp32.ids.numel(), plans()[i : i + 1])
        single = fp32.decoder.sample(ctx, noise=x0[i : i + 1])
        worst = max(worst, max_abs_error(batched[i : i + 1], single))
    record_figure("K=3 batched vs single max abs", worst)
    assert worst <= 1e-5


def test_guidance_weight_one_equals_no_guidance_exactly(golden, fp32):
    x0 = noise(seed=5)
    unguided_ids = unguided_prompt(fp32.ids.tolist(), ROUTE_START, ROUTE_END)
    cfg1 = ExpertDecoder(fp32.expert, FlowSettings(guidance=1.0))
    unguided = cfg1.unguided_context(fp32.vlm, unguided_ids, fp32.features, plans(), TRAJ_START, FILLER)
    assert torch.equal(
        cfg1.sample(fp32.ctx, noise=x0, unguided=unguided), fp32.decoder.sample(fp32.ctx, noise=x0)
    )


def test_guidance_matches_hf_composed_guided_unguided_pair(golden, fp32, record_figure):
    w = 1.5
    unguided_ids = torch.tensor(unguided_prompt(fp32.ids.tolist(), ROUTE_START, ROUTE_END))
    assert unguided_ids.numel() == fp32.ids.numel() - len(b"turn left") - 2
    decoder = ExpertDecoder(fp32.expert, FlowSettings(guidance=w))
    unguided = decoder.unguided_context(
        fp32.vlm, unguided_ids.tolist(), fp32.features, plans(), TRAJ_START, FILLER
    )
    # NVIDIA's unguided branch: prefill the route-less prompt, repeat, replay every generated token at once.
    u_inputs = dict(fp32.hf_inputs)
    u_inputs["mm_token_type_ids"] = (unguided_ids == TOKEN_IDS["<|image_pad|>"]).to(torch.int32).view(1, -1)
    u_cache, u_delta, u_len = hf_cache(fp32.hf, unguided_ids, u_inputs, fp32.replay, step_by_step=False)
    u_offsets = [u_len + len(r) + 1 for r in REASONING]
    assert unguided.offsets.tolist() == u_offsets and u_cache.get_seq_length() == u_len + fp32.replay.shape[1]
    u_pos, u_mask = expert_inputs(u_offsets, u_delta, u_cache.get_seq_length(), torch.float32)

    def hf_guided(x, t):
        guided = fp32.hf_step(x, t)
        plain = fp32.hf_expert.step(x, t, u_cache, u_pos, u_mask)
        return (1 - w) * plain + w * guided

    x0 = noise(seed=6)
    expected = hf_euler(hf_guided, x0, 10)
    actual = decoder.sample(fp32.ctx, noise=x0, unguided=unguided)
    err = float(np.abs(xyz(expected) - xyz(actual)).max())
    record_figure(f"CFG w={w} 10-step pred_xyz fp32 max abs (m)", err)
    assert err <= 1e-4
    # the guidance changed the result (a broken unguided branch could not pass by accident)
    assert float(np.abs(xyz(actual) - xyz(fp32.decoder.sample(fp32.ctx, noise=x0))).max()) > 1e-3
    # the VLM's own cache and state came back
    assert fp32.vlm.text.cache_len == fp32.ids.numel() + fp32.replay.shape[1] - 1


# ---------------------------------------------------------------- the in-projection against its formula


def test_default_freqs_are_bfloat16_rounded_logspace():
    # NVIDIA's 1.5 buffers, created while bfloat16 is the default dtype (alpamayo-code-audit.md B.3)
    expected = [1.0, 1.671875, 2.78125, 4.65625, 7.75, 12.9375, 21.5, 36.0, 60.0, 100.0]
    assert default_freqs(InProjConfig()).tolist() == expected
    assert not torch.equal(default_freqs(InProjConfig()), torch.logspace(0, 2, 10))


def test_fourier_features_match_the_formula_on_hand_picked_inputs():
    freqs = default_freqs(InProjConfig())
    u = torch.tensor([0.0, 0.25, -0.5, 1.0 / 3.0])
    out = fourier_features(u, freqs)
    assert out.shape == (4, 20) and out.dtype == torch.float32
    assert torch.equal(out[0], torch.cat([torch.zeros(10), torch.full((10,), math.sqrt(2))]))
    for i, value in enumerate(u.tolist()):
        for j, f in enumerate(freqs.tolist()):
            # the float32 argument (u f) 2 pi, rounded at each product as NVIDIA's float32 ops round it
            angle = float(np.float32(np.float32(np.float32(value) * np.float32(f)) * 2) * np.float32(math.pi))
            assert out[i, j].item() == pytest.approx(math.sqrt(2) * math.sin(angle), abs=2e-6)
            assert out[i, 10 + j].item() == pytest.approx(math.sqrt(2) * math.cos(angle), abs=2e-6)


def test_in_projection_matches_nvidia_structure(golden):
    cfg = golden["cfg"]
    ours = load_expert(golden["path"], cfg, golden["cfg"].text).in_proj
    ref = HFExpert(cfg, golden["weights"], torch.float32).in_proj
    x, t = noise(seed=7), torch.tensor([0.0, 0.4, 0.9])
    assert torch.equal(ours.features(x, t)[..., :20], fourier_features(x[:, :, 0], ref.freqs[0].float()))
    assert max_abs_error(ref(x, t.view(-1, 1, 1)), ours(x, t)) <= 2e-6


def test_r1_stored_freqs_buffers_win(golden, tmp_path):
    """R1 checkpoints store the Fourier `freqs` buffers; the stored values are used, not the computed table."""
    import shutil

    cfg = golden["cfg"]
    path = tmp_path / "r1"
    shutil.copytree(golden["path"], path)
    tensors = load_file(path / "model.safetensors")
    stored = torch.linspace(0.5, 3.0, 10)
    for name in cfg.freqs_keys():
        tensors[name] = stored[None].to(torch.bfloat16)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    expert = load_expert(path, cfg, cfg.text)
    x, t = noise(seed=8), torch.tensor([0.1, 0.2, 0.3])
    expected = fourier_features(t, stored.to(torch.bfloat16).float())
    assert torch.equal(expert.in_proj.features(x, t)[:, 0, 40:], expected)


# ---------------------------------------------------------------- bad input


def test_bad_noise_and_flow_steps_are_clear_errors():
    with pytest.raises(ValueError, match=r"initial noise must have shape \[3, 64, 2\].*got \[3, 64\]"):
        check_noise(torch.zeros(3, 64), 3, 64)
    bad = torch.zeros(3, 64, 2)
    bad[1, 5, 0] = float("nan")
    with pytest.raises(ValueError, match=r"initial noise must be finite; element \[1, 5, 0\] is nan"):
        check_noise(bad, 3, 64)
    with pytest.raises(ValueError, match="flow steps must be an integer >= 1, got 0"):
        FlowSettings(steps=0)
    with pytest.raises(ValueError, match="flow steps must be an integer >= 1, got 0"):
        euler_sample(torch.zeros(1, 64, 2), 0, lambda x, t: x)
    with pytest.raises(ValueError, match="flow temperature must be a finite number > 0"):
        FlowSettings(temperature=0.0)


def test_expert_with_other_kv_width_is_refused_before_reading_weights(golden):
    raw = dict(EXPERT_RAW, expert_cfg=dict(EXPERT_RAW["expert_cfg"], num_key_value_heads=3))
    cfg = parse_expert_config(raw, VLM_TEXT)
    ckpt = Checkpoint(golden["path"])
    with pytest.raises(ConfigError, match=r"KV width 48 \(num_key_value_heads 3 x head_dim 16\).*VLM's 32"):
        load_expert(ckpt, cfg, golden["cfg"].text)
    assert not ckpt._handles  # no tensor file was opened


def test_missing_or_misshaped_expert_tensor_names_it(golden, tmp_path):
    path = tmp_path / "bad"
    path.mkdir()
    tensors = load_file(golden["path"] / "model.safetensors")
    del tensors["expert.layers.1.mlp.up_proj.weight"]
    tensors["action_out_proj.weight"] = torch.zeros(3, 48)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        load_expert(path, golden["cfg"], golden["cfg"].text)
    assert "missing tensor 'expert.layers.1.mlp.up_proj.weight' (expected shape [80, 48])" in str(e.value)
    assert "tensor 'action_out_proj.weight' in model.safetensors has shape [3, 48], expected [2, 48]" in str(
        e.value
    )


def test_guidance_without_route_and_super_guidance_off_its_noise_temperature_are_refused(golden, fp32):
    with pytest.raises(ValueError, match="navigation guidance needs a route"):
        unguided_prompt(fp32.ids.tolist(), ROUTE_START + 10, ROUTE_END)
    import dataclasses

    expert = load_expert(golden["path"], golden["cfg"], golden["cfg"].text)
    ExpertDecoder(expert, FlowSettings(temperature=0.6, guidance=1.5))  # 1.5: any noise temperature
    expert.cfg = dataclasses.replace(expert.cfg, guided_temperature=1.0)  # Super's
    ExpertDecoder(expert, FlowSettings(temperature=0.6))  # without guidance: any
    with pytest.raises(
        ValueError,
        match=r"--flow-temperature 0.6 with --nav-guidance: this checkpoint's navigation guidance draws its "
        r"noise at temperature 1 \(Alpamayo 2 Super",
    ):
        ExpertDecoder(expert, FlowSettings(temperature=0.6, guidance="checkpoint"))


def test_guidance_at_the_checkpoint_weight_reads_diffusion_cfg(golden):
    import dataclasses

    expert = load_expert(golden["path"], golden["cfg"], golden["cfg"].text)
    expert.cfg = dataclasses.replace(expert.cfg, guidance_weight=2.5)
    settings = FlowSettings(guidance="checkpoint")
    assert (
        settings.guidance_for(expert.cfg) == 2.5
        and FlowSettings(guidance=1.5).guidance_for(expert.cfg) == 1.5
    )
    assert ExpertDecoder(expert, settings).record() == {"steps": 10, "temperature": 1.0, "guidance": 2.5}
    with pytest.raises(
        ValueError, match=r"navigation guidance weight must be a finite number or 'checkpoint'"
    ):
        FlowSettings(guidance="config")


@pytest.mark.cuda
def test_cuda_graph_replay_equals_the_eager_step(golden):
    """The captured expert step replays to the eager step's velocities, step after step (new x and t each)."""
    from alpamayo.expert.cuda_graph import GraphedVelocity
    from alpamayo.text.kv_cache import KVCache

    cfg = golden["cfg"]
    expert = load_expert(golden["path"], cfg, cfg.text, torch.float32, "cuda")
    t_cfg = cfg.text
    cache = KVCache(
        t_cfg.num_hidden_layers, K, t_cfg.num_key_value_heads, 96, t_cfg.head_dim, torch.float32, "cuda"
    )
    g = torch.Generator().manual_seed(9)
    for buf in (*cache.k, *cache.v):
        buf.copy_(torch.randn(buf.shape, generator=g))
    ctx = expert.context(cache, [40, 71, 55], -7, 80)
    graphed = GraphedVelocity(expert, ctx)
    for step in range(3):
        x, t = noise(seed=10 + step).cuda(), torch.full((K,), 0.1 * step, device="cuda")
        eager = expert.velocity(x, t, ctx)
        assert torch.equal(graphed(x, t), eager)
    decoder = ExpertDecoder(expert, cuda_graph=True)
    x0 = noise(seed=20)
    assert max_abs_error(decoder.sample(ctx, noise=x0), ExpertDecoder(expert).sample(ctx, noise=x0)) <= 1e-6

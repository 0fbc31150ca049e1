"""Alpamayo 2 Super's navigation guidance against NVIDIA's `examples/two_gpu_nav_cfg_demo.py`, composed over
transformers' modules on the tiny Super release layout.

The reference, step by step as the example runs it (`sample_with_nav_cfg`, `prepare_nav_model_inputs`):
  * two prompts from `build_conversation`: components `image, traj_history, nav_instruction, prompt` (guided,
    the route as a raw text item) and `image, traj_history, prompt` (unguided), rendered with the checkpoint's
    chat template and `add_generation_prompt`; the same float pixels (`images / 255`, `do_rescale=False`);
  * guided: `Qwen3VLForConditionalGeneration` prefills its prompt and generates the reasoning token by token up
    to `<|traj_future_start|>` (the token generated after it never enters the cache);
  * unguided: the same model prefills the unguided prompt with the guided pixels, then replays every generated
    token in one forward (`build_unguided_continuation_inputs`): the reasoning, `<|traj_future_start|>` and the
    extra token after it (padding, attention mask 0), so its cache holds one position more than the offset;
  * `build_expert_pos_ids_and_attn_mask` per branch: positions j + rope_delta + offset, the 4-D mask at the
    float32 minimum from the offset on (the extra token); the expert step (`expert_step`: in-projection,
    `Qwen3VLTextModel` over the branch's cache appended and cropped, out-projection);
  * `FlowMatching._euler` with `use_classifier_free_guidance`: v = (1 - w) v_unguided + w v_guided, w = the
    checkpoint's `diffusion_cfg.inference_guidance_weight`, noise at temperature 1.
Ours runs `AlpamayoVLA.predict(route=..., noise=...)` with `--nav-guidance` at the checkpoint's weight; the
decoder's two contexts are taken from its `sample` call.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from alpamayo.checkpoint import INDEX_FILE
from alpamayo.config.expert import expert_config_of
from alpamayo.config.flow import CHECKPOINT_GUIDANCE
from alpamayo.config.loader import model_tokenizer
from alpamayo.demo_checkpoint import hf_vlm
from alpamayo.demo_release import make_demo_checkpoint
from alpamayo.expert.decoding import ExpertDecoder
from alpamayo.generation import Sampling
from alpamayo.model_spec import ModelSpec
from alpamayo.numerics import max_abs_error
from alpamayo.runtime import AlpamayoVLA
from tests.hf_checkpoints import hf_float_image_processor, nvidia_float_pixels
from tests.test_expert_golden import N_TOKENS, OUT_SCALE, HFExpert, expert_inputs, noise
from tests.test_families import weights_on_disk
from tests.test_runtime import straight_history

ROUTE = "Turn right in 30m"  # the example's default navigation text
WEIGHT = 1.5  # diffusion_cfg.inference_guidance_weight written into the test checkpoint
CAMERA = 1
MAX_REASONING = 4
STEPS = 10
# NVIDIA's `build_conversation` pieces (chat_template/conversation.py)
SYSTEM = "You are a driving assistant that generates safe and accurate actions."
INSTRUCTION = (
    "output the chain-of-thought reasoning of the driving process, then output the future trajectory."
)


def frames() -> tuple[dict[int, list[np.ndarray]], dict[int, list[int]]]:
    """One camera's 4 frames at 360 x 640 (resized to 320 x 576 by Super's float path)."""
    rng = np.random.default_rng(5)
    return (
        {CAMERA: [rng.integers(0, 256, (360, 640, 3), dtype=np.uint8) for _ in range(4)]},
        {CAMERA: [k * 100_000_000 for k in range(4)]},
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny Super release with a guidance weight in its `diffusion_cfg` and a smaller out-projection: the
    random expert's flow field is chaotic (a 2e-7 difference in x grew about 10x per Euler step, 0.2 after 10),
    and as in tests/test_expert_golden.py a scaled out-projection makes it about as smooth as a trained one."""
    path = make_demo_checkpoint(tmp_path_factory.mktemp("super") / "ckpt", seed=0, layout="super")
    raw = json.loads((path / "config.json").read_text())
    raw["expert_config"]["diffusion_cfg"]["inference_guidance_weight"] = WEIGHT
    (path / "config.json").write_text(json.dumps(raw))
    name = "expert.action_out_proj.weight"
    shard = path / json.loads((path / INDEX_FILE).read_text())["weight_map"][name]
    tensors = load_file(shard)
    tensors[name] = tensors[name] * OUT_SCALE
    save_file(tensors, shard, metadata={"format": "pt"})
    return path


def nvidia_prompt_ids(
    tokenizer, grid: torch.Tensor, history_ids: list[int], route: str | None
) -> torch.Tensor:
    """`build_conversation` (generation mode, camera and frame labels, the empty assistant turn dropped),
    rendered by the chat template with the generation prompt; then the processor's image-pad expansion and
    `fuse_traj_tokens`' history ids."""
    content = [{"type": "text", "text": "Front camera: "}]
    for i in range(4):
        content += [{"type": "text", "text": f"frame {i} "}, {"type": "image"}]
    history = "<|traj_history|>" * len(history_ids)
    content.append({"type": "text", "text": f"<|traj_history_start|>{history}<|traj_history_end|>"})
    if route is not None:
        content.append({"type": "text", "text": route})
    content.append({"type": "text", "text": INSTRUCTION})
    messages = [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
        {"role": "user", "content": content},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    for g in grid:  # the processor's expansion of each image's one pad
        text = text.replace("<|image_pad|>", "\0" * (int(g.prod()) // 4), 1)
    ids = torch.tensor(tokenizer(text.replace("\0", "<|image_pad|>"), add_special_tokens=False)["input_ids"])
    ids[ids == tokenizer.convert_tokens_to_ids("<|traj_history|>")] = torch.tensor(history_ids)
    return ids


class Reference:
    """NVIDIA's guided example over transformers' VLM and expert, after our run's reasoning tokens."""

    def __init__(self, path, vla: AlpamayoVLA, reasoning: list[int]):
        cfg = vla.vlm.config
        tokenizer = model_tokenizer(cfg)
        raw = json.loads((path / "config.json").read_text())
        weights = weights_on_disk(path)
        self.vlm = hf_vlm(raw["vlm_config"])
        self.vlm.load_state_dict({k[4:]: v for k, v in weights.items() if k.startswith("vlm.")}, strict=True)
        self.expert = HFExpert(expert_config_of(cfg), weights, torch.float32)
        images = frames()[0][CAMERA]
        pixels, grid = nvidia_float_pixels(hf_float_image_processor(163840, 196608), images)
        bins = vla.planner.history_tokenizer.encode(vla.planner.history(straight_history()).xyz)
        history = [tokenizer.convert_tokens_to_ids(f"<i{b}>") for b in bins]  # Super: history bins from <i0>
        self.guided_ids = nvidia_prompt_ids(tokenizer, grid, history, ROUTE)
        self.unguided_ids = nvidia_prompt_ids(tokenizer, grid, history, None)
        start = tokenizer.convert_tokens_to_ids("<|traj_future_start|>")
        pad = tokenizer.convert_tokens_to_ids(
            "<|endoftext|>"
        )  # Qwen's pad token, `replace_padding_after_eos`
        generated = torch.tensor([[*reasoning, start, pad]])  # the token after the start becomes padding
        pixel_inputs = {"pixel_values": pixels, "image_grid_thw": grid}
        with torch.no_grad():
            # guided: generation feeds the prompt, then each generated token but the last
            self.vlm.model.rope_deltas = None
            cache = self.prefill(self.guided_ids, pixel_inputs)
            for i in range(generated.shape[1] - 1):
                self.decode(generated[:, i : i + 1], cache)
            delta = int(self.vlm.model.rope_deltas.reshape(-1)[0])
            self.guided = (cache, *self.inputs(len(self.guided_ids) + len(reasoning) + 1, delta, cache))
            # unguided: prefill with the guided pixels, replay all generated tokens at once
            self.vlm.model.rope_deltas = None
            u_cache = self.prefill(self.unguided_ids, pixel_inputs)
            mask = torch.cat([torch.ones(1, len(self.unguided_ids)), generated.ne(pad).float()], 1).long()
            self.decode(generated, u_cache, mask)
            u_delta = int(self.vlm.model.rope_deltas.reshape(-1)[0])
            u_offset = len(self.unguided_ids) + len(reasoning) + 1  # `find_eos_offset` on the full sequence
            self.unguided = (u_cache, *self.inputs(u_offset, u_delta, u_cache))

    def prefill(self, ids: torch.Tensor, pixel_inputs: dict):
        mm = (ids == self.vlm.config.image_token_id).to(torch.int32).view(1, -1)
        out = self.vlm(input_ids=ids.view(1, -1), **pixel_inputs, mm_token_type_ids=mm, use_cache=True)
        return out.past_key_values

    def decode(self, tokens: torch.Tensor, cache, mask: torch.Tensor | None = None) -> None:
        """Feed `tokens` [1, n] after the cache with the (prefix + tokens) attention `mask`. Positions are
        transformers 4.57's (NVIDIA's pin) for a cached forward: cache position + rope_deltas on all three rows
        (transformers 5 would count them from the mask instead)."""
        length = cache.get_seq_length()
        position = torch.arange(length, length + tokens.shape[1])
        rows = (position + self.vlm.model.rope_deltas.reshape(-1)[0]).view(1, 1, -1).expand(3, 1, -1)
        self.vlm(
            input_ids=tokens,
            past_key_values=cache,
            attention_mask=mask,
            position_ids=rows,
            cache_position=position,
            use_cache=True,
        )

    @staticmethod
    def inputs(offset: int, delta: int, cache) -> tuple[torch.Tensor, torch.Tensor]:
        return expert_inputs([offset], delta, cache.get_seq_length(), torch.float32)

    def velocities(self, x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(guided, unguided) velocity at x [1, 64, 2], t [1, 1, 1]: `guided_step_fn`, `unguided_step_fn`."""
        return self.expert.step(x, t, *self.guided), self.expert.step(x, t, *self.unguided)


@pytest.fixture(scope="module")
def run(checkpoint):
    """Our guided prediction (greedy reasoning capped at MAX_REASONING, fixed noise) with the two contexts its
    decoder sampled from, and NVIDIA's composition after the same reasoning."""
    vla = AlpamayoVLA.from_spec(
        ModelSpec(checkpoint=checkpoint, max_reasoning_tokens=MAX_REASONING, nav_guidance=CHECKPOINT_GUIDANCE)
    )
    seen = {}
    sample = ExpertDecoder.sample

    def spy(self, ctx, seed=None, noise=None, unguided=None, tracer=None, cancel=None):
        seen.update(ctx=ctx, unguided=unguided)
        return sample(self, ctx, seed, noise, unguided, tracer, cancel)

    x0 = noise(rows=1, seed=11)
    shots, times = frames()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ExpertDecoder, "sample", spy)
        prediction = vla.predict(
            shots,
            straight_history(),
            route=ROUTE,
            sampling=Sampling(),
            noise=x0.numpy(),
            frame_times_ns=times,
        )
    (result,) = prediction.samples
    ref = Reference(checkpoint, vla, result.reasoning_token_ids)
    return dict(vla=vla, prediction=prediction, sample=result, ref=ref, x0=x0, **seen)


def test_the_two_contexts_are_nvidias(run):
    """Offsets, M-RoPE positions and masks of both branches: the unguided one a different, shorter prompt,
    its cache one position longer than its offset (the replayed extra token), that position masked."""
    ref, ctx, unguided = run["ref"], run["ctx"], run["unguided"]
    assert len(ref.unguided_ids) < len(ref.guided_ids)
    g_pos, g_mask = ref.guided[1:]
    u_cache, u_pos, u_mask = ref.unguided
    assert ctx.offsets.tolist() == [len(ref.guided_ids) + len(run["sample"].reasoning_token_ids) + 1]
    assert unguided.offsets.tolist() == [len(ref.unguided_ids) + len(run["sample"].reasoning_token_ids) + 1]
    assert torch.equal(ctx.positions, g_pos[0]) and torch.equal(unguided.positions, u_pos[0])
    assert unguided.bias.shape[-1] == u_cache.get_seq_length() == int(unguided.offsets[0]) + 1
    hidden = (unguided.bias[0, 0, 0] == float("-inf")).nonzero().flatten().tolist()
    assert (
        hidden
        == [int(unguided.offsets[0])]
        == (u_mask[0, 0, 0, :-N_TOKENS] != 0).nonzero().flatten().tolist()
    )
    assert not (ctx.bias == float("-inf")).any() and not (g_mask != 0).any()


def test_guided_and_unguided_velocities_equal_the_example_per_step(run, record_figure):
    """Along the reference's Euler path, each step's guided and unguided velocities (and their mix) match."""
    ref, expert = run["ref"], run["vla"].expert.expert
    x = run["x0"].clone()
    times = torch.linspace(0.0, 1.0, STEPS + 1)
    worst = {"guided": 0.0, "unguided": 0.0}
    for k in range(STEPS):
        t = times[k].view(1, 1, 1)
        v_guided, v_unguided = ref.velocities(x, t)
        ours_guided = expert.velocity(x, times[k].view(1), run["ctx"])
        ours_unguided = expert.velocity(x, times[k].view(1), run["unguided"])
        worst["guided"] = max(worst["guided"], max_abs_error(v_guided, ours_guided))
        worst["unguided"] = max(worst["unguided"], max_abs_error(v_unguided, ours_unguided))
        x = x + (times[k + 1] - times[k]).view(1, 1, 1) * ((1 - WEIGHT) * v_unguided + WEIGHT * v_guided)
    for branch, err in worst.items():
        record_figure(f"{branch} velocity max abs over {STEPS} steps (fp32)", err)
        assert err <= 1e-4


def test_guided_trajectory_equals_the_example(run, record_figure):
    """The whole guided sampling: our actions and waypoints against the example's Euler result at the
    checkpoint's weight; the guidance moved them (a broken unguided branch could not pass by accident)."""
    ref, vla, sample = run["ref"], run["vla"], run["sample"]
    assert run["prediction"].flow == {"steps": STEPS, "temperature": 1.0, "guidance": WEIGHT}
    x = run["x0"].clone()
    times = torch.linspace(0.0, 1.0, STEPS + 1)
    guided_only = run["x0"].clone()
    for k in range(STEPS):
        t, dt = times[k].view(1, 1, 1), (times[k + 1] - times[k]).view(1, 1, 1)
        v_guided, v_unguided = ref.velocities(x, t)
        x = x + dt * ((1 - WEIGHT) * v_unguided + WEIGHT * v_guided)
        guided_only = guided_only + dt * ref.velocities(guided_only, t)[0]
    action_space = vla.planner.action_space
    history = vla.planner.history(straight_history())
    v0, z0 = action_space.estimate_v0(history), float(history.xyz[-1, 2])
    expected = action_space.rollout(action_space.denormalise(x[0].double().numpy()), v0, z0=z0)[0]
    err = float(np.abs(expected - sample.xyz).max())
    record_figure("guided pred_xyz max abs vs the example (m, fp32)", err)
    assert err <= 1e-4
    unguided = action_space.rollout(action_space.denormalise(guided_only[0].double().numpy()), v0, z0=z0)[0]
    assert float(np.abs(unguided - sample.xyz).max()) > 1e-3

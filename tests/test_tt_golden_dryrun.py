"""The golden mode and the dry run run the same device programs: the same ops in the same order, each output
with the same shape, padded shape, dtype, layout and memory placement (marked `dryrun` and `golden`).

The dry run's ttnn (a mock p150: ttnn's own validation, no numbers) and the golden mode's (`GoldenTTNN`:
numbers, its own checks) each run the text model (dense and MoE, prefill, decode, a verify block, a fork)
and the vision tower on the same checkpoint; a recorder between each model and its ttnn logs every op's
outputs. Equal logs mean the golden mode's numbers come from the programs a card would run, at the shapes
and placements ttnn itself gives them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.tt_checkpoints import save_tt_checkpoint

pytestmark = [pytest.mark.dryrun, pytest.mark.golden]

PROMPT_LEN = 126


def describe(x: Any) -> Any:
    """What the comparison sees of an op's output: per tensor its logical and padded shape, dtype, layout and
    memory placement (layout, buffer, shard shape and core count); host tensors without a placement."""
    if isinstance(x, (list, tuple)):
        return [describe(t) for t in x]
    if not hasattr(x, "padded_shape"):
        return None
    try:
        mem = x.memory_config()
    except RuntimeError:  # a golden host tensor
        mem = None
    place = None
    if mem is not None and str(x.storage_type()).endswith("DEVICE"):
        spec = mem.shard_spec
        shard = None if spec is None else (tuple(spec.shape), spec.grid.num_cores())
        place = (str(mem.memory_layout), str(mem.buffer_type), shard)
    return (tuple(x.shape), tuple(x.padded_shape), str(x.dtype), str(x.layout), place)


class Recorder:
    """Stands between a model and its ttnn: logs (op, outputs) of every call, passes everything else on."""

    SKIP = frozenset({"deallocate", "synchronize_device"})

    def __init__(self, ttnn: Any, log: list, prefix: str = "ttnn"):
        self._ttnn, self._log, self._prefix = ttnn, log, prefix

    def __getattr__(self, name: str) -> Any:
        obj = getattr(self._ttnn, name)
        path = f"{self._prefix}.{name}"
        if name in ("experimental", "transformer"):
            return Recorder(obj, self._log, path)
        if not callable(obj) or isinstance(obj, type) or name[0].isupper() or name in self.SKIP:
            return obj

        def call(*args: Any, **kwargs: Any) -> Any:
            out = obj(*args, **kwargs)
            self._log.append((path, describe(out)))
            return out

        return call


@pytest.fixture
def recorded(monkeypatch):
    """Models built inside get a `Recorder` around their ttnn; yields the log."""
    import alpamayo.tt.text.model
    import alpamayo.tt.vision
    import alpamayo.tt.weight_cache
    from alpamayo.tt import device as tt_device

    log: list = []

    def ttnn_for(device: Any) -> Any:
        return Recorder(tt_device.ttnn_for(device), log)

    for module in (alpamayo.tt.text.model, alpamayo.tt.vision, alpamayo.tt.weight_cache):
        monkeypatch.setattr(module, "ttnn_for", ttnn_for)
    return log


def text_run(path, device) -> None:
    from alpamayo.tt.text import TTTextModel

    with TTTextModel.from_checkpoint(path, precision="accuracy", device=device) as tt:
        tt.setup_cache(256, max_batch=2 if not tt.moe else 1)
        prompt = torch.arange(PROMPT_LEN) % min(tt.text_cfg.vocab_size, 256)
        tt.prefill(prompt)
        tt.decode(3, traced=False)
        if not tt.moe:  # MoE layers decode one row
            tt.verify(torch.tensor([[4, 5, 6]]), traced=False)
            tt.fork(2)
            tt.decode(torch.tensor([7, 8]), traced=False)


def expert_run(path, device) -> None:
    """The demo's action expert: 2 samples over 2 forked, ragged slots, 2 Euler steps."""
    from alpamayo.config.expert import expert_config_of
    from alpamayo.config.loader import load_model_config
    from alpamayo.tt.expert import TTActionExpert
    from alpamayo.tt.text import TTTextModel

    with TTTextModel.from_checkpoint(path, precision="accuracy", device=device) as text:
        expert = TTActionExpert.from_checkpoint(
            path, text, expert_config_of(load_model_config(path)), samples=2
        )
        text.setup_cache(256, max_batch=2)
        text.prefill(torch.arange(PROMPT_LEN) % 256)
        text.fork(2)
        text.decode(torch.tensor([1, 2]), traced=False)
        text.rollback([PROMPT_LEN + 1, PROMPT_LEN])
        expert.sample(torch.zeros(2, 64, 2), text.lengths, text.rope_delta, steps=2, traced=False)
        expert.close()


def draft_run(path, device) -> None:
    """A DFlash draft on the device over 2 rows: the prompt's context, a block, accepted rows, a block."""
    from alpamayo.drafts import DraftContext
    from alpamayo.tt.draft import TTDFlashDraft
    from alpamayo.tt.text import TTTextModel
    from tests.dflash_checkpoints import dflash_config, save_dflash, target_heads

    with TTTextModel.from_checkpoint(path, precision="accuracy", device=device) as text:
        if not (path / "draft").is_dir():
            t = text.text_cfg
            cfg = dflash_config(t, block_size=8, target_layer_ids=[0, 1], **target_heads(t))
            save_dflash(path / "draft", cfg, seed=4)
        draft = TTDFlashDraft.load(path / "draft", text)
        text.setup_cache(256, max_batch=2)
        prompt = torch.arange(PROMPT_LEN) % 256
        text.prefill(prompt, capture=draft.capture)
        text.fork(2)
        draft.begin(DraftContext(prompt.tolist(), 2, None, None))
        draft.block_logits([5, 6], traced=False)
        draft.accepted(0, [1, 2, 3], torch.randn(3, len(draft.capture) * text.text_cfg.hidden_size))
        draft.block_logits([7, 8], traced=False)
        draft.close()


def vision_run(path, device) -> None:
    from alpamayo.tt.vision import TTVisionEncoder

    tt = TTVisionEncoder.from_checkpoint(path, precision="accuracy", device=device)
    try:
        grid = torch.tensor([[1, 8, 12], [2, 4, 8]])
        tt.encode(torch.rand(int(grid.prod(-1).sum()), tt.cfg.patch_dim), grid)
    finally:
        tt.close()


RUNS = {"demo": text_run, "moe": text_run, "vision": vision_run, "expert": expert_run, "draft": draft_run}


@pytest.mark.parametrize("model", list(RUNS))
def test_every_op_gives_the_dry_runs_shapes_dtypes_and_placements(
    model, recorded, dryrun_device, golden_device, demo_checkpoint, tmp_path
):
    path = demo_checkpoint
    if model in ("moe", "draft"):
        save_tt_checkpoint(tmp_path, "moe" if model == "moe" else "gqa2", seed=3)
        path = tmp_path
    run = RUNS[model]
    logs = []
    for device in (dryrun_device, golden_device):
        run(path, device)
        logs.append(list(recorded))
        recorded.clear()
    dry, golden = logs
    assert len(dry) > 100
    for i, (a, b) in enumerate(zip(dry, golden, strict=False)):
        assert a == b, f"op {i}: dry run {a}\n golden {b}"
    assert len(dry) == len(golden)

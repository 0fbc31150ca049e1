"""`QuantizedCheckpoint`: the weights as the device holds them, through the CPU block-float emulation.

Against ttnn's own host packer: every weight of a MoE checkpoint stored in the released hub expert layout, of
the demo checkpoint (tied head, vision tower, a residual stream padded 128 -> 256) and of a 72-wide-head vision
tower, prepared in the device layout, packed by ttnn in the recipe's dtype and restored, must equal what
`QuantizedCheckpoint` serves, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from alpamayo.checkpoint import Checkpoint
from alpamayo.config.expert import expert_config_of
from alpamayo.config.loader import load_model_config
from alpamayo.plan.precision import PRESETS
from alpamayo.plan.vision_weights import vision_weight_specs
from alpamayo.plan.weights import prepare, restore, text_weight_specs, weight_dtype
from alpamayo.text import TextModel
from alpamayo.text.moe.weights import DOWN, EXPERT_DOWN, EXPERT_GATE, EXPERT_UP, GATE_UP, ExpertView
from alpamayo.text.weights import EMBED, LM_HEAD
from alpamayo.tt.quantized import QuantizedCheckpoint
from alpamayo.tt.weight_cache import to_host_tensor
from tests.hf_checkpoints import rewrite_hub_layout
from tests.tt_checkpoints import VISION_72, save_tt_checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, demo_checkpoint):
    moe = tmp_path_factory.mktemp("q-moe")
    save_tt_checkpoint(moe, "moe", seed=3, vision=VISION_72)
    assert rewrite_hub_layout(moe) == 4  # 2 layers x (gate_up, down)
    return {"moe-hub-layout": moe, "demo": demo_checkpoint}


def _through_ttnn(ttnn, directory, recipe: str) -> dict[str, torch.Tensor]:
    """name -> tensor: each spec packed by ttnn's host packer in the recipe dtype, restored (experts as views)."""
    cfg = load_model_config(directory)
    ckpt = Checkpoint(directory, cfg.weight_prefix)
    get = ExpertView(cfg.text, ckpt.get)
    precision = PRESETS[recipe]
    out = {}
    for spec in text_weight_specs(cfg, 8) + vision_weight_specs(cfg.vision):
        prepared = prepare(spec, get)
        host = to_host_tensor(ttnn, prepared, weight_dtype(spec, precision), spec.layout)
        packed = ttnn.to_torch(host).reshape(prepared.shape).float()
        for name, t in restore(spec, packed).items():
            out[LM_HEAD if spec.name == "lm_head" else name] = t
    return out


@pytest.mark.parametrize("recipe", ["accuracy", "performance"])
@pytest.mark.parametrize("name", ["moe-hub-layout", "demo"])
def test_every_weight_reads_back_as_ttnns_packer_rounds_it(ttnn_host, checkpoints, name, recipe):
    directory = checkpoints[name]
    expected = _through_ttnn(ttnn_host, directory, recipe)
    q = QuantizedCheckpoint(directory, recipe)
    plain = Checkpoint(directory, q.weight_prefix)
    compared = set()
    for source in plain.names():
        if source.endswith((GATE_UP, DOWN)):
            prefix = source.rpartition("experts.")[0]
            views = [expected[prefix + v] for v in (EXPERT_GATE, EXPERT_UP, EXPERT_DOWN)]
            want = torch.cat(views[:2], 1) if source.endswith(GATE_UP) else views[2]
            want = want.transpose(1, 2)  # this checkpoint stores the hub layout
        elif source in expected:
            want = expected[source].reshape(plain.shape(source))
        else:
            continue
        assert torch.equal(q.get(source), want), source
        compared.add(source)
    # every device weight of the VLM; the demo checkpoint's action expert is no text- or vision-tower weight
    expert = expert_config_of(load_model_config(directory))
    not_vlm = set(expert.weight_shapes()) if expert is not None else set()
    assert compared == set(plain.names()) - {EMBED, "visual.pos_embed.weight"} - not_vlm


def test_a_tied_head_is_untied_into_its_own_dtype_and_the_embedding_stays_bf16(tmp_path):
    save_tt_checkpoint(tmp_path, "gqa8-tied", seed=4)
    q = QuantizedCheckpoint(tmp_path, "performance")
    assert load_model_config(tmp_path).tie_word_embeddings and not q.config.tie_word_embeddings
    plain = Checkpoint(tmp_path, q.weight_prefix)
    embed = plain.get(EMBED)
    assert LM_HEAD not in plain and LM_HEAD in q
    assert torch.equal(q.get(EMBED), embed.to(torch.bfloat16).to(embed.dtype))
    head = q.get(LM_HEAD)  # bfp8 blocks along the vocabulary of the [hidden, vocab] device layout
    assert head.shape == embed.shape and not torch.equal(head, q.get(EMBED))
    assert torch.equal(q.get("visual.pos_embed.weight"), plain.get("visual.pos_embed.weight"))  # host table


def test_a_torch_model_runs_on_the_served_weights(demo_checkpoint):
    q = QuantizedCheckpoint(demo_checkpoint, "accuracy")
    model = TextModel.from_checkpoint(q, q.config)
    model.setup_cache(16)
    logits = model.prefill(torch.arange(10))
    assert logits.shape == (q.config.text.vocab_size,) and torch.isfinite(logits).all()

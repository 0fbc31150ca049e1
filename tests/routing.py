"""Routing margins of a torch reference's MoE layers, for device tests that compare one token at a time, and
greedy near-ties of its logits, for device tests that compare accepted lengths.

A token whose k-th and (k+1)-th routing probabilities nearly tie can pick either expert under rounding: the
device (bf16 activations) and the float32 reference then run different experts and the layer outputs differ
by a whole expert's contribution, although both are right. Tests skip (and count) such single-token checks.
Likewise a greedy decision between two tokens whose reference logits nearly tie can go either way on the
device, whose bf16 logits and activations move each logit by ~1% of the logits' spread.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from alpamayo.text.moe.block import SparseMoE

# A relative gap (p_k - p_k+1) / p_k under 2% is within reach of bf16 activation rounding of the router input
# (measured with the tiny MoE checkpoint: a flip at a 0.01% gap took a decode layer from PCC 0.9999 to 0.90).
NEAR_TIE = 0.02


# A top-1 / top-2 gap under 5% of the logits' standard deviation is within reach of the device's rounding:
# found by the golden mode on the tiny 8:1 checkpoint's verify blocks (logits PCC 0.9999, ~1.4% of the
# spread): a 2.0% gap (2.435 against 2.415) came out as two equal bf16 logits and the other token won.
GREEDY_TIE = 0.05


def greedy_tie(logits: torch.Tensor) -> bool:
    """The reference's greedy choice from logits [V] nearly ties with its runner-up (`GREEDY_TIE`)."""
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1]) < GREEDY_TIE * float(logits.float().std())


def routing_margin(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Per row of router logits [T, E]: (p_k - p_{k+1}) / p_k of its softmax (p sorted descending)."""
    probs = torch.softmax(logits.float(), dim=-1).sort(dim=-1, descending=True).values
    return (probs[:, k - 1] - probs[:, k]) / probs[:, k - 1]


@contextmanager
def router_margins(model: torch.nn.Module) -> Iterator[dict[int, list[torch.Tensor]]]:
    """While inside, every routing of the model's sparse layers appends its rows' margins to out[layer]."""
    out: dict[int, list[torch.Tensor]] = {}
    handles = []
    for i, layer in enumerate(model.layers):
        if isinstance(layer.mlp, SparseMoE):
            router = layer.mlp.router

            def hook(module, inputs, logits, i=i, k=router.k):
                out.setdefault(i, []).append(routing_margin(logits.reshape(-1, logits.shape[-1]), k))

            handles.append(router.proj.register_forward_hook(hook))
    try:
        yield out
    finally:
        for h in handles:
            h.remove()

"""Linear layer with a packed CPU oneDNN path (bfloat16 and float32) whose rows do not depend on each other.

On CPU, bfloat16 and float32 weights are packed once into oneDNN's blocked layout
(`mkldnn._reorder_linear_weight`) and multiplied by its brgemm kernel. Two reasons:

* A row's result never depends on how many rows run with it, so a verify block, K sampled rows and a
  one-token decode give each token the same bits. oneDNN's brgemm gives every row the same result for any
  M >= 2 rows and any thread count (`torch.equal` for M = 2..512 and 1, 2, 4, 16 threads at the
  Qwen3-VL-2B/8B linears and the 151936-row head, float32 and bfloat16, 2 AVX512-BF16 cores), but blocks K
  differently for M = 1 once in_features > 1024, rounding a one-row product apart (~1e-6 in float32); so
  fewer than `MIN_ROWS` rows are padded with zero rows. MKL's sgemm (what `F.linear` runs in float32) rounds
  by the row count at every M (its M = 1 is a gemv; M = 4 and M = 8 differ too).
* Speed: 6 rows are brgemm's full row block here (fewer run a tail kernel, more a second block). Measured on
  the same 2 cores (one thread, CPU time, least of 11 interleaved rounds: the machine was shared), 2
  Qwen3-VL-8B layers and the 151936-row head: a decode step's linears at 6 packed rows took 208 ms in
  float32 against MKL's one-row gemv's 205, and 116 ms in bfloat16 against the packed one-row kernel's 131
  (2 packed rows: 304 and 149 ms, 4: 223 and 124, 8: 274 and 148); a float32 verify of 8 rows 274 ms
  packed against MKL's 902.

A CPU without oneDNN's bfloat16 support (it needs AVX512-BW/VL/DQ or AVX-NE-CONVERT: an AVX2-only AMD EPYC, say)
cannot pack a bfloat16 weight (`_reorder_linear_weight` raises), so its bfloat16 linears run `F.linear`, torch's
own bfloat16 GEMM. That kernel computes each output as one float32-accumulated dot product in a fixed order,
so it keeps the row guarantee too (`tests/test_exact_rows.py` on such a host). Measured on 2 AVX2 cores: every
row count from 1 to 8, and 17, 40 and 512 (64 at the head), equal to one row at a time, at 1 and 2 threads, at
512x1280, 2048x2048, 6144x2048, 2048x6144 and the 151936-row head. It is slower there than a float32 packed
product for many rows (2048x2048 at M = 512: 223 ms against 36 ms) and faster for one (0.54 ms against 1.16 ms:
half the bytes); packing such a weight as float32 would double a bfloat16 model's memory, so it stays bfloat16.

Everywhere else (CUDA, other dtypes, builds without mkldnn) `F.linear` is used, with no row guarantee. With a
`QuantRecipe` (`--quant int8|int4`) packing instead quantises the weight for PyTorch's weight-only kernels
(`alpamayo.quant`); the linear's `role` decides whether the recipe applies to it.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from alpamayo.quant import QuantRecipe, QuantWeight, describe_fallbacks, quantise_weight
from alpamayo.quant.cache import PackedWeightCache
from alpamayo.text.threads import wide

# rows a packed product runs at the least: oneDNN's M = 1 kernel rounds apart from M >= 2, and 6 rows are its
# fastest small shape (module docstring)
MIN_ROWS = 6


def can_pack(weight: torch.Tensor) -> bool:
    """True where the packed oneDNN layout applies: a CPU float32 weight on a build with mkldnn, or a bfloat16
    one where oneDNN also supports bfloat16 on this CPU (module docstring)."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.bfloat16, torch.float32):
        return False
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    return weight.dtype == torch.float32 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class Linear(nn.Module):
    """y = x @ W^T + b for W [out_features, in_features]; x [..., in_features].

    role: "body", "head" (an LM head or output projection: quantised only with `QuantRecipe.head`) or
    "router" (never quantised); see `alpamayo.quant.recipe`.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, role: str = "body"):
        super().__init__()
        self.weight: torch.Tensor | None = weight
        self.bias = bias
        self.role = role
        self.out_features, self.in_features = weight.shape
        self._packed: torch.Tensor | None = None
        self.quantised: QuantWeight | None = None

    def pack(
        self,
        keep_plain: bool = False,
        quant: QuantRecipe | None = None,
        name: str = "linear",
        cache: PackedWeightCache | None = None,
    ) -> None:
        """Switch to the packed (or, where `quant` applies to this role, quantised) layout; the last step after
        the weights reached their device. `name` is the layer named in quantisation errors (and its file in
        `cache`, which keeps the quantised form on disk for the next load).

        The plain weight is released unless `keep_plain` (a tied head shares it with the embedding table).
        """
        if self.weight is None:
            return
        if quant is not None and quant.applies_to(self.role):
            if cache is None:
                self.quantised = quantise_weight(self.weight, quant, name)
            else:
                self.quantised = cache.quantised(self.weight, quant, name)
        elif can_pack(self.weight):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, MIN_ROWS)
        else:
            return
        if not keep_plain:
            self.weight = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with wide():  # every thread for the matmul, also inside a few-row forward (`alpamayo.text.threads`)
            return self._matmul(x)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantised is not None:
            y = self.quantised.matmul(x)
            return y if self.bias is None else y + self.bias
        if self._packed is None:
            if self.weight is None:  # pack() drops the plain weight only once it has packed it
                raise RuntimeError("a Linear without its weight and unpacked")
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, self.in_features)
        rows = flat.shape[0]
        if rows < MIN_ROWS:  # zero rows, so every row's product is the brgemm's M >= 2 one
            flat = F.pad(flat, (0, 0, 0, MIN_ROWS - rows))
        y = torch.ops.mkldnn._linear_pointwise(flat, self._packed, self.bias, "none", [], "")
        return y[:rows].view(*x.shape[:-1], self.out_features)


def pack_linears(
    root: nn.Module,
    keep_plain: torch.Tensor | None = None,
    quant: QuantRecipe | None = None,
    cache: PackedWeightCache | None = None,
    part: str = "model",
) -> None:
    """`Linear.pack` every linear under `root` (quantised by `quant` where it applies to the linear's role,
    through `cache` when given), the last step once the weights are on their device; one whose weight is
    `keep_plain` (a head tied to the embedding table) keeps the plain weight as well. The linears an int4
    recipe packed at int8 (`alpamayo.quant.layer_mode`) are named on one stderr line for `part`."""
    fallen: list[tuple[str, int]] = []
    quantised, device = 0, torch.device("cpu")
    for name, module in root.named_modules():
        if isinstance(module, Linear):
            tied = keep_plain is not None and module.weight is keep_plain
            module.pack(keep_plain=tied, quant=quant, name=name, cache=cache)
            if module.quantised is not None and quant is not None:
                quantised += 1
                device = next(iter(module.quantised.tensors().values())).device
                if module.quantised.mode != quant.mode:
                    fallen.append((name, module.in_features))
    if fallen and quant is not None:
        print(
            f"alpamayo: --quant {describe_fallbacks(quant, device, part, fallen, quantised)}", file=sys.stderr
        )

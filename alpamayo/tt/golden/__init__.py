"""The golden mode of the ttnn backend: every device program run on the host through ttnn's own golden
functions, with no device opened.

`--backend ttnn --tt-mode golden` (or `ALPAMAYO_TT_MODE=golden`) makes `alpamayo.tt.device.open_device`
return a `GoldenDevice`, and `alpamayo.tt.device.ttnn_for(device)` (the one place the models get their
`ttnn` from) hands the models a `GoldenTTNN` instead of the ttnn module. The model code is the same code that
runs on a card: every ttnn call goes to Tenstorrent's golden function of the op
(`ttnn.get_golden_function(op)`), or, for the ops without one, to our torch implementation in
`alpamayo.tt.golden.ops` (`OWN_OPS`). Tensors hold the values a card would hold: weights, the KV cache and
every activation are rounded into their ttnn dtype through ttnn's own host packing (bfloat8_b / bfloat4_b
through `ttnn.Tensor(...).to_torch()`), and each op computes in float32 on them.

What it checks beside the numbers (`alpamayo.tt.golden.checks`): shard specs against the tensors they hold,
program configs against the ops they configure, indices in range, reads of deallocated tensors, reads of
memory nothing wrote (allocations hold NaN), `sparse_matmul`'s nnz, and two rows of one `paged_update_cache`
on one cache tile (a race on a card). What it does not model: math fidelity and the device's intermediate
roundings inside an op, anything about L1 / DRAM allocation or program creation (the dry run's), and traces:
a traced step runs as its untraced ops (`alpamayo.tt.text.trace.TraceSwitch` says so once on stderr).
"""

from alpamayo.tt.golden.device import GoldenDevice
from alpamayo.tt.golden.namespace import OWN_OPS, GoldenTTNN
from alpamayo.tt.golden.tensor import GoldenTensor

__all__ = ["OWN_OPS", "GoldenDevice", "GoldenTTNN", "GoldenTensor"]

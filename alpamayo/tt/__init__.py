"""ttnn backend for one Tenstorrent Blackhole p150: text backbone (dense or MoE) and vision tower (see
docs/ttnn-text.md and docs/ttnn.md), and its golden mode (docs/ttnn-golden.md).

Importing this package never imports `ttnn`; `alpamayo.tt.device.import_ttnn()` is the one place that does,
and the models take the `ttnn` they call from their device through `alpamayo.tt.device.ttnn_for` (the ttnn
module, or the golden mode's `alpamayo.tt.golden.GoldenTTNN`).
"""

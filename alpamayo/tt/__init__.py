"""ttnn backend for one Tenstorrent Blackhole p150: text backbone (dense or MoE) and vision tower (see
docs/ttnn-text.md and docs/ttnn.md).

Importing this package never imports `ttnn`; `alpamayo.tt.runtime.import_ttnn()` is the one place that does.
"""

"""ttnn backend for one Tenstorrent Blackhole p150 (see docs/ttnn-text.md).

Importing this package never imports `ttnn`; `alpamayo.tt.runtime.import_ttnn()` is the one place that does.
"""

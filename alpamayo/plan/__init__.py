"""What a model needs of a machine, planned before anything is loaded (pure Python and torch; never ttnn).

The ttnn backend's plans: precision recipes (`precision`) and their block-float maths (`block_float`), the
device (`device_spec`), the device weights' layouts (`weights`, `expert_weights`, `vision_weights`,
`draft_weights`), the program configs of each component (`programs`), the DRAM plan (`dram`), the latency
estimate (`estimate`) and its calibration on measured anchors (`calibration`). The torch backend's GPU memory
plan (`gpu_memory`). `alpamayo plan` prints them; `alpamayo.tt` runs what they plan.
"""

"""Model families: bare Qwen3-VL, the project's demo layout, Alpamayo 1 (R1), 1.5 and 2 Super.

`registry` says what each family means (`Family`) and detects it from `config.json`; `base_model` finds an
R1 / 1.5 checkpoint's base model offline; `vocabulary` extends its tokenizer in NVIDIA's order. The loader that
puts them together with the config (`load_model_config`, `model_tokenizer`, `check_checkpoint`) is
`alpamayo.config.loader`, one layer up.
"""

"""Configuration: what a checkpoint is and how its components run, read as data (never imported from Hydra).

model     a checkpoint's `config.json` -> `ModelConfig` (`TextConfig`, `VisionConfig`), every family
moe       the MoE settings: a checkpoint's `MoEConfig`, the block's shape and placement `MoEBlockConfig`
expert    the flow-matching action expert's `ExpertConfig`
flow      how the expert samples (`FlowSettings`: steps, noise temperature, navigation guidance)
loader    one loader for every family: config, tokenizer, checks (`load_model_config`, `model_tokenizer`)
builtin   the published configs bundled in `published/` and their lookup (`builtin_config`,
          `builtin_expert`, the MoE block config a model runs with)
"""

"""The flow-matching action expert: the trajectory decoder NVIDIA's Alpamayo releases use for inference.

It reads the VLM's KV cache after `<|traj_future_start|>` and turns noise into normalised (acceleration,
curvature) actions in a few Euler steps. Its settings are `alpamayo.config.expert` (from a checkpoint's
config.json) and `alpamayo.config.flow` (how a run samples).

    in_proj     PerWaypointActionInProjV2: Fourier features of the noisy actions and t, MLP, LayerNorm
    model       ActionExpert: alpamayo.text's layers attending over a read-only VLM cache prefix; ExpertContext
    weights     validation and loading of every family's tensors
    sampler     Euler flow matching, initial noise, navigation guidance mix
    decoding    the runtime's trajectory decoder: offsets, the unguided branch, the decoder choice
    cuda_graph  the velocity step captured as a CUDA graph
    demo        random expert weights under the real names (demo and test checkpoints)
"""

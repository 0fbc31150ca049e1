"""Error types raised for bad checkpoints, configs and inputs.

Each message names the offending field, tensor or value, and the file or allowed range it came from.
"""


class ConfigError(ValueError):
    """A `config.json` (or other config file) is malformed, incomplete or describes an unsupported model."""


class CheckpointError(ValueError):
    """A safetensors checkpoint is missing, truncated, mis-shaped or inconsistent with its config."""


class BackendUnavailable(RuntimeError):
    """A compute backend cannot run here: its library is not installed or its device is absent.

    The message says which of the two it is and what still works without it.
    """

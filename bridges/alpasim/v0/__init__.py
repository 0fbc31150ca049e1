"""AlpaSim's wire contract, generated from the ``.proto`` files beside this module.

Regenerate after editing a ``.proto`` (from the repository root)::

    python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. bridges/alpasim/v0/*.proto
"""

# The alpasim_grpc release these protos are (NVlabs/alpasim 3032e0c, src/grpc/pyproject.toml): what get_version
# reports as grpc_api_version, as NVIDIA's driver reports its installed alpasim_grpc (API_VERSION_MESSAGE).
# Change it with the protos.
ALPASIM_GRPC_VERSION = (0, 54, 0)

"""AlpaSim's wire contract, generated from the ``.proto`` files beside this module.

Regenerate after editing a ``.proto`` (from the repository root)::

    python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. bridges/alpasim/v0/*.proto
"""

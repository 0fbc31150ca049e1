"""How the AlpaSim service refuses a request: a gRPC status code, the counter it is counted under, a message."""

from __future__ import annotations

import grpc


class InputRejected(Exception):
    """A request the service refuses: ``code`` the gRPC status, ``reason`` the counter it is counted under
    (`DriverAdmin.get_status`'s ``rejected``), the message the caller reads."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason = code, reason

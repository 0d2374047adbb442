"""APIError: a bad request as the server answers it (HTTP 4xx with an OpenAI-style error
body), raised by the request parsers of server/ and api/native.py."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = (
            status, message, param, type_, code)
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)

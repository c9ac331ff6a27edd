"""Errors as OpenAI's API shapes them: ``{"error": {"message", "type", "param", "code"}}``.

The ``openai`` client reads ``error.message`` into its exception and maps the status to its class
(400 BadRequestError, 401 AuthenticationError, 404 NotFoundError, 413 and 429 ... ), and retries 429
and 5xx by itself, honouring ``Retry-After``: the status and that header are what clients act on.
"""

from __future__ import annotations

import math

import orjson
from aiohttp import web

__all__ = ["ApiError", "error_body", "error_response"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
    503: "server_error",
}


class ApiError(Exception):
    """A request answered with an error by the gateway itself (never sent to a server)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def response(self) -> web.Response:
        return error_response(
            self.status, self.message, param=self.param, code=self.code, retry_after_s=self.retry_after_s
        )


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(
    status: int, message: str, *, param: str | None = None, code: str | None = None, retry_after_s: float | None = None
) -> web.Response:
    headers = {"Retry-After": str(max(1, math.ceil(retry_after_s)))} if retry_after_s is not None else None
    return web.Response(
        status=status,
        body=orjson.dumps(error_body(status, message, param=param, code=code)),
        content_type="application/json",
        headers=headers,
    )

"""What the gateway checks of a request before any server sees it (pure: bytes in, fields out).

Malformed JSON, a body that is not an object, a missing or ill-typed ``model`` or the endpoint's
required field (``prompt``; ``messages``, a non-empty list) are 400 with the field named in
``param``; the body is passed on byte for byte when it passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from servefleet.serve.errors import ApiError

__all__ = ["Parsed", "parse_request", "ENDPOINTS"]

# path -> the field each request of it must carry
ENDPOINTS: dict[str, str] = {"/v1/completions": "prompt", "/v1/chat/completions": "messages"}


@dataclass(frozen=True, slots=True)
class Parsed:
    model: str
    stream: bool


def parse_request(raw: bytes, path: str) -> Parsed:
    if not raw:
        raise ApiError(400, "the request has no body: expected a JSON object")
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the body must be a JSON object, not {type(body).__name__}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(
            400,
            "missing field 'model' (a string): which model to use"
            if model is None
            else "'model' must be a non-empty string",
            param="model",
        )
    field = ENDPOINTS[path]
    value = body.get(field)
    if value is None:
        raise ApiError(400, f"missing field {field!r}", param=field)
    if field == "messages" and (not isinstance(value, list) or not value):
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    if field == "prompt" and not isinstance(value, (str, list)):
        raise ApiError(400, "'prompt' must be a string or a list", param="prompt")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise ApiError(400, "'stream' must be true or false", param="stream")
    return Parsed(model, bool(stream))

"""HTTP-facing errors of the OpenAI-compatible server, named for the state they report.

Each carries its HTTP status and the error body's `type`, spelled as vLLM spells them
(`BadRequestError`, `NotFoundError`, ...); `app.py` turns them, and the engine's own errors, into
one OpenAI-style error body at the edge.
"""

from __future__ import annotations


class ApiError(Exception):
    status = 500
    type = "InternalServerError"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param  # the request field at fault, when there is one


class BadRequest(ApiError):
    status = 400
    type = "BadRequestError"


class Unauthorized(ApiError):
    status = 401
    type = "AuthenticationError"


class UnknownModel(ApiError):
    status = 404
    type = "NotFoundError"


class RequestIdInUse(ApiError):
    status = 409
    type = "ConflictError"


class BodyTooLarge(ApiError):
    status = 413
    type = "BadRequestError"


class GenerationFailed(ApiError):
    """The engine step computing the request failed (it finished with ERROR)."""


class EngineUnavailable(ApiError):
    status = 503
    type = "ServiceUnavailableError"

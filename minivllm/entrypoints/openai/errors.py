"""The error the server answers with OpenAI's error body (vLLM: create_error_response,
vllm/entrypoints/serve/exception_handling/error_response.py)."""

from __future__ import annotations

from http import HTTPStatus

from minivllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse, to_json


class OpenAIError(Exception):
    """An error the server answers with OpenAI's error body."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST,
                 err_type: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.err_type, self.param = status, err_type, param

    def error_response(self) -> ErrorResponse:
        return ErrorResponse(ErrorInfo(str(self), self.err_type, self.param, int(self.status)))

    def body(self) -> bytes:
        return to_json(self.error_response())

    @classmethod
    def from_exception(cls, exc: BaseException) -> "OpenAIError":
        from minivllm.engine.exceptions import EngineDeadError
        if isinstance(exc, OpenAIError):
            return exc
        if isinstance(exc, EngineDeadError):
            return cls(f"the engine is dead: {exc}", HTTPStatus.INTERNAL_SERVER_ERROR,
                       "InternalServerError")
        if isinstance(exc, (ValueError, TypeError, OverflowError)):
            return cls(str(exc))
        return cls(f"{type(exc).__name__}: {exc}", HTTPStatus.INTERNAL_SERVER_ERROR,
                   "InternalServerError")

"""Proxy errors, converted to the client's API shape only at the edge (OpenAI JSON, or an SSE error event)."""

from __future__ import annotations


class ProxyError(Exception):
    """An error the proxy answers with ``status``; ``code`` is machine-readable, the message says value, rule, fix."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.call_id: str | None = None  # the stored call that recorded this error (the service sets it)

    def openai_body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def unauthorized(message: str) -> ProxyError:
    return ProxyError(401, message, type="authentication_error", code="invalid_api_key")


class UpstreamFailure(ProxyError):
    """The upstream could not be reached (502) or went silent (504): an infrastructure error, not a model answer."""

    def __init__(self, status: int, message: str, error_class: str):
        super().__init__(status, message, type="upstream_error", code=error_class)
        self.error_class = error_class

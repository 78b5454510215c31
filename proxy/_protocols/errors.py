"""What the protocols share for errors: a client's 400, translations that must never become a 500 (a request's:
the client's 400; an answer's: the upstream's 502), and the message inside an upstream's error body."""

from __future__ import annotations

import functools

import orjson

from .._errors import ProxyError, UpstreamFailure


def bad_request(message: str, param: str | None = None, code: str = "invalid_request") -> ProxyError:
    return ProxyError(400, message, param=param, code=code)


def guarded(translate):
    """A translation reads only the client's body: a shape it did not expect is the client's 400, never a 500."""

    @functools.wraps(translate)
    def wrapper(self, body: dict, *args):
        try:
            return translate(self, body, *args)
        except (TypeError, AttributeError, KeyError, ValueError, IndexError) as exc:
            raise bad_request(f"the request could not be translated for a chat-completions upstream "
                              f"({exc.__class__.__name__}: {exc}); check the body against the API reference",
                              code="untranslatable_request") from exc

    return wrapper


def answer_guarded(translate):
    """An answer translation reads only the upstream's answer: a shape it did not expect is the upstream's broken
    protocol, an ``UpstreamFailure`` 502 (which the service records; in a stream, the API's failure event), never a
    500. A stream event that is not JSON stays ``orjson.JSONDecodeError`` (the service reports that itself)."""

    @functools.wraps(translate)
    def wrapper(*args):
        try:
            return translate(*args)
        except orjson.JSONDecodeError:
            raise
        except (TypeError, AttributeError, KeyError, ValueError, IndexError) as exc:
            raise UpstreamFailure(502, f"the upstream's answer is not a chat completion the proxy can translate "
                                       f"({exc.__class__.__name__}: {exc})", "upstream_protocol") from exc

    return wrapper


def upstream_message(body: bytes) -> str:
    """The human message inside an upstream error body (OpenAI or Anthropic shaped), else the body's text."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:2000].decode(errors="replace")
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return data["message"]
    return body[:2000].decode(errors="replace")

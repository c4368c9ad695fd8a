"""Real vLLM (CPU build) as minirl's rollout engine: building an in-process ``LLM`` from a spec,
syncing trainer weights into it, recording its MoE routing, and the rollout engine the trainer
selects with ``engine: vllm``. vLLM is imported only when one of these is used."""

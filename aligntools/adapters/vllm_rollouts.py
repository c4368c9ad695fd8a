"""Real vLLM as minirl's rollout engine: ``generate(prompts, params) -> list[Rollout]`` and
``load_weights(model)``, the two methods the RL trainer calls (``minirl.rollout_engine``).

Why it lives here and not in minirl: minirl never imports aligntools, and creating, hooking and
re-loading an in-process vLLM is this package's business (``vllm_engine``). Pass it to the
trainer: ``minirl.train(config, engine=VllmRollouts.create(path, "bfloat16"))``.

Logprobs are vLLM's ``raw_logprobs`` (its default ``logprobs_mode``): log-softmax of the model's
logits before temperature / top-k / top-p, the same convention as minirl's ``Rollout.logprobs``
(docs/conventions.md), so the mismatch ratio compares like with like. Routed experts are not
returned (vLLM's ``enable_return_routed_experts`` needs its GPU model runner), so R3 router
replay is refused with a clear error rather than silently replaying nothing.
"""

from __future__ import annotations

import os

import torch

from aligntools.adapters.vllm_engine import create_llm, sync_weights
from minirl import Rollout, SamplingParams


class VllmRollouts:
    """Rollouts from an in-process vLLM ``LLM`` (made with ``create_llm``: eager, in process)."""

    returns_routed_experts = False

    def __init__(self, llm: object) -> None:
        self.llm = llm

    @classmethod
    def create(cls, path: str | os.PathLike, dtype: str = "bfloat16", **options: object) -> "VllmRollouts":
        """A rollout engine over checkpoint ``path`` (vLLM options as in the ``vllm`` engine spec)."""
        return cls(create_llm(path, dtype, **options))

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        """``params.n`` samples per prompt, prompt-major, with raw logprobs of the sampled tokens."""
        from vllm import SamplingParams as VllmParams

        vp = VllmParams(n=params.n, temperature=params.temperature, top_p=params.top_p,
                        top_k=params.top_k if params.top_k > 0 else -1, max_tokens=params.max_new_tokens,
                        stop_token_ids=list(params.stop_token_ids), ignore_eos=params.ignore_eos,
                        seed=params.seed, logprobs=0)
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], vp, use_tqdm=False)
        rollouts = []
        for prompt, request in zip(prompts, outs):
            for sample in request.outputs:  # [n] completions of this prompt
                ids = list(sample.token_ids)
                logprobs = torch.tensor([step[t].logprob for t, step in zip(ids, sample.logprobs)],
                                        dtype=torch.float32)  # [T] raw
                rollouts.append(Rollout(prompt_ids=list(prompt), token_ids=ids, logprobs=logprobs,
                                        finish_reason="stop" if sample.finish_reason == "stop" else "length"))
        return rollouts

    def load_weights(self, model: torch.nn.Module) -> None:
        """Weight sync after each update: the running engine serves the trainer's new weights."""
        sync_weights(self.llm, model.state_dict())

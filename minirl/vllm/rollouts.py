"""Real vLLM as minirl's rollout engine: ``generate(prompts, params) -> list[Rollout]`` and
``load_weights(model)``, the two methods the RL trainer calls (``minirl.engines.RolloutEngine``).

Pass it to the trainer: ``engine: vllm`` in the run's config (``minirl.engines.build_engine``
wraps the LLM it builds), or ``minirl.train(config, engine=VllmRollouts.create(path, "bfloat16"))``.
The LLM comes from ``minirl.vllm.llm.create_llm``, the one place an in-process vLLM is made, so a
spec gives the same engine for capture, the gate and RL.

Logprobs are vLLM's ``raw_logprobs`` (its default ``logprobs_mode``): log-softmax of the model's
logits before temperature / top-k / top-p, the same convention as minirl's ``Rollout.logprobs``
(docs/conventions.md), so the mismatch ratio compares like with like. On a MoE model each
rollout also carries vLLM's own expert choices (``prompt_routed_experts`` + ``routed_experts``,
minirl's layout), recorded by hooks during ``generate`` (``minirl.vllm.routing``): that is what R3 router
replay replays; vLLM's ``enable_return_routed_experts`` needs its GPU model runner.
"""

from __future__ import annotations

import os

import torch

from minirl.engine.rollout import Rollout
from minirl.engine.sampling import SamplingParams
from minirl.vllm.llm import checkpoint_state, create_llm, sync_drift, sync_weights
from minirl.vllm.routing import RoutingRecorder


class VllmRollouts:
    """Rollouts from an in-process vLLM ``LLM`` (made with ``create_llm``: eager, in process)."""

    def __init__(self, llm: object) -> None:
        self.llm = llm
        self.routing = RoutingRecorder(llm)
        self.returns_routed_experts = self.routing.is_moe  # R3 can replay them

    @classmethod
    def create(cls, path: str | os.PathLike, dtype: str, **options: object) -> "VllmRollouts":
        """A rollout engine over checkpoint ``path`` (dtype and options as in the ``vllm`` engine
        spec; from a spec text: ``minirl.engines.build_engine(spec, path, rollouts=True)``)."""
        return cls(create_llm(path, dtype, **options))

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        """``params.n`` samples per prompt, prompt-major, with raw logprobs of the sampled tokens."""
        from vllm import SamplingParams as VllmParams

        vp = VllmParams(n=params.n, temperature=params.temperature, top_p=params.top_p,
                        top_k=params.top_k if params.top_k > 0 else -1, max_tokens=params.max_new_tokens,
                        stop_token_ids=list(params.stop_token_ids), ignore_eos=params.ignore_eos,
                        seed=params.seed, logprobs=0)
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        if self.returns_routed_experts:
            with self.routing:
                outs = self.llm.generate(requests, vp, use_tqdm=False)
        else:
            outs = self.llm.generate(requests, vp, use_tqdm=False)
        rollouts = []
        for prompt, request in zip(prompts, outs):
            for sample in request.outputs:  # [n] completions of this prompt
                ids = list(sample.token_ids)
                logprobs = torch.tensor([step[t].logprob for t, step in zip(ids, sample.logprobs)],
                                        dtype=torch.float32)  # [T] raw
                rollout = Rollout(prompt_ids=list(prompt), token_ids=ids, logprobs=logprobs,
                                  finish_reason="stop" if sample.finish_reason == "stop" else "length")
                if self.returns_routed_experts:
                    routed = self.routing.routed_experts(  # [P + T, n_moe_layers, k]
                        self.routing.request_for(request.request_id, sample.index, params.n), list(prompt) + ids)
                    rollout.prompt_routed_experts, rollout.routed_experts = routed[: len(prompt)], routed[len(prompt):]
                rollouts.append(rollout)
        return rollouts

    def load_weights(self, model: torch.nn.Module) -> None:
        """Weight sync after each update: the running engine serves the trainer's new weights."""
        sync_weights(self.llm, checkpoint_state(model))

    def sync_drift(self, model: torch.nn.Module, ids: torch.Tensor) -> float:
        """Max |Δ logprob| of the engine on ``ids`` across a sync of ``model``'s (unchanged)
        weights: 0 exactly, or the sync corrupts the engine (``minirl.vllm.llm.sync_drift``)."""
        return sync_drift(self.llm, model, ids)

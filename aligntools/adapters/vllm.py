"""vLLM ``LLM`` -> sites (GPU machines; vLLM is imported only when such a target is captured).

Requirements, because hooks must live where the model runs: ``LLM(..., enforce_eager=True)``
(CUDA graphs replay kernels without calling module hooks) and the engine in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so ``collective_rpc`` hands back the worker's model
runner itself. Token layout per forward: ``input_ids``/``positions`` from the model call,
request boundaries from the forward context's ``query_start_loc``, request identity from the
runner's persistent batch (``input_batch.req_ids``, stable across decode steps), and the step
from the position relative to the request's prompt length. Module conventions: see fused.py.
"""

from __future__ import annotations

import torch

from aligntools.adapters.fused import FusedModuleAdapter, Rows, flat_meta


class VllmAdapter(FusedModuleAdapter):
    engine = "vllm"

    def __init__(self, llm: object) -> None:
        runner = llm.collective_rpc(lambda worker: worker.model_runner)[0]
        if not hasattr(runner, "model"):
            raise RuntimeError("cannot reach vLLM's model runner from this process: create the LLM with "
                               "VLLM_ENABLE_V1_MULTIPROCESSING=0 and enforce_eager=True")
        self.llm, self.runner = llm, runner
        self._request_index: dict[str, int] = {}
        super().__init__(runner.model, runner.model_config.hf_config, self._layout)

    def _layout(self, args: tuple, kwargs: dict) -> list[Rows]:
        from vllm.forward_context import get_forward_context

        input_ids = kwargs.get("input_ids", args[0] if args else None)
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        meta = get_forward_context().attn_metadata
        meta = next(iter(meta.values())) if isinstance(meta, dict) else meta
        batch = self.runner.input_batch
        n_req = batch.num_reqs
        qsl = meta.query_start_loc[: n_req + 1].cpu()
        n_tok = int(qsl[-1])  # eager mode pads nothing, but slice to be safe
        requests, steps = [], []
        for i, rid in enumerate(batch.req_ids[:n_req]):
            requests.append(self._request_index.setdefault(rid, len(self._request_index)))
            first_pos = int(positions[int(qsl[i])])
            steps.append(max(0, first_pos - int(batch.num_prompt_tokens[i]) + 1))
        return flat_meta(input_ids[:n_tok], positions[:n_tok], qsl, requests, steps)

    def run(self, input_ids: torch.Tensor) -> None:
        """Prefill every row once (prompt logprobs make vLLM compute logits at every position)."""
        from vllm import SamplingParams

        prompts = [{"prompt_token_ids": row} for row in input_ids.tolist()]
        self.llm.generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)

    def describe(self) -> dict:
        info = super().describe()
        info["knobs"] = {"enforce_eager": True, "dtype": info["dtype"]}
        return info

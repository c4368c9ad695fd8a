"""Real SGLang as minirl's rollout engine: ``generate(prompts, params) -> list[Rollout]`` and
``load_weights(model)``, the two methods the RL trainer calls (``minirl.engines.RolloutEngine``).

Selected with ``engine: sglang`` (``minirl.engines.build_engine`` wraps the runner it builds), or
``minirl.train(config, engine=SglangRollouts(create_runner(path, "bfloat16")))``. Sampling is
SGLang's own (its pytorch sampler, ``torch.multinomial`` on torch's generator). A call runs under
``torch.random.fork_rng`` seeded with ``params.seed`` (drawn from torch's RNG when the params give
none, so ``torch.manual_seed`` repeats a run): the same prompts and seed give the same rollouts,
and the caller's RNG stream is left as it was. SGLang's per-request ``sampling_seed`` needs its
deterministic-inference mode, which changes its kernels, so it is not used; a sample therefore
depends on the batch it was drawn in.
Logprobs are raw: log-softmax of SGLang's next-token logits, before temperature / top-k / top-p,
minirl's ``Rollout.logprobs`` convention (docs/conventions.md).

Routed experts are not returned (``returns_routed_experts = False``): router replay R3 is refused
by name for this engine; R2 (recorded in the trainer's own pass) works.
"""

from __future__ import annotations

import torch

from minirl.engine.rollout import Rollout
from minirl.engine.sampling import SamplingParams
from minirl.sglang.runner import SglangRunner


class SglangRollouts:
    """Rollouts from an in-process SGLang runner (``minirl.sglang.runner.create_runner``)."""

    returns_routed_experts = False

    def __init__(self, runner: SglangRunner) -> None:
        self.runner = runner
        eos = getattr(runner.hf_config, "eos_token_id", None)
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Rollout]:
        """``params.n`` samples per prompt, prompt-major, with raw logprobs of the sampled tokens.
        Every request is decoded until all have stopped; tokens after a request's stop are dropped."""
        rows = [list(p) for p in prompts for _ in range(params.n)]
        need = sum(len(r) + params.max_new_tokens for r in rows)
        if need > self.runner.max_total_tokens:
            raise ValueError(f"{len(rows)} rollouts need {need} KV slots, more than SGLang's max_total_tokens="
                             f"{self.runner.max_total_tokens}; roll out fewer prompts per step or raise the "
                             f"sglang option max_total_tokens")
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2**31 - 1, ()))
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_ids)
        reqs = [self.runner.requests([row], logprob_start=None, temperature=params.temperature, top_p=params.top_p,
                                     top_k=params.top_k if params.top_k > 0 else -1,
                                     max_new_tokens=params.max_new_tokens)[0] for row in rows]
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return self._sample(rows, reqs, params.max_new_tokens, stops)

    def _sample(self, rows: list[list[int]], reqs: list, max_new_tokens: int, stops: set[int]) -> list[Rollout]:
        tokens: list[list[int]] = [[] for _ in rows]
        logprobs: list[list[float]] = [[] for _ in rows]
        done = [False] * len(rows)
        try:
            step = self.runner.prefill(reqs)
            for t in range(max_new_tokens):
                ids = step.next_ids
                picked = step.logprobs.gather(1, ids.long()[:, None])[:, 0].tolist()
                for i, (tok, lp) in enumerate(zip(ids.tolist(), picked)):
                    if not done[i]:
                        tokens[i].append(tok)
                        logprobs[i].append(lp)
                        done[i] = tok in stops
                if all(done) or t + 1 == max_new_tokens:
                    break
                step = self.runner.decode(ids, step.batch)
        finally:
            self.runner.clear()
        return [Rollout(prompt_ids=row, token_ids=tok, logprobs=torch.tensor(lp, dtype=torch.float32),
                        finish_reason="stop" if stopped else "length")
                for row, tok, lp, stopped in zip(rows, tokens, logprobs, done)]

    def load_weights(self, model: torch.nn.Module) -> None:
        """Weight sync after each update: SGLang's own ``update_weights_from_tensor``, fed the
        checkpoint's names (``checkpoint_weights``)."""
        self.runner.load_weights(checkpoint_weights(model))


def checkpoint_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The training model's weights under the names and layout of its checkpoint on disk.

    Why: transformers 5 fuses a MoE layer's experts at load (``mlp.experts.gate_up_proj``
    [E, 2I, H]), while SGLang's ``load_weights`` reads checkpoint names (``mlp.experts.{e}.gate_proj
    .weight``) and skips a name it does not know without a word: the experts were never synced
    (tiny-qwen3-moe: L0.mlp_out rel_l2 0.71 after a sync). transformers' own ``save_pretrained``
    step (``revert_weight_conversion``) undoes the fusion."""
    from transformers.core_model_loading import revert_weight_conversion

    state = {k: v.detach() for k, v in model.state_dict().items()}
    return revert_weight_conversion(model, state) if hasattr(model, "config") else state

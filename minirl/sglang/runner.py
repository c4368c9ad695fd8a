"""An SGLang ``ModelRunner`` in this process, driven the way SGLang's one-batch benchmark
(``sglang.benchmark.one_batch``) drives it: no scheduler, no tokenizer, no server.

Why in process and not ``sglang.Engine``: the engine runs the model in a spawned child, out of
reach of capture hooks, and its start-up took 114-132 s here; the runner starts in ~25 s (20 of
them importing SGLang) and its modules are this process's. Settings (docs/sglang.md): CPU torch
with ``attention_backend="torch_native"`` (SDPA), ``sampling_backend="pytorch"``, no CUDA graphs,
no radix cache (a cached prefix is not recomputed, so its activations would be missing from a
capture), a 4,096-token KV pool, and ``mem_fraction_static=0.5`` (SGLang sizes memory machine-wide).
"""

from __future__ import annotations

import importlib.util
import os
import platform
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from minirl.sglang.standins import install

SETTINGS = {"device": "cpu", "attention_backend": "torch_native", "sampling_backend": "pytorch",
            "disable_cuda_graph": True, "disable_radix_cache": True, "mem_fraction_static": 0.5,
            "skip_tokenizer_init": True}
DEFAULT_MAX_TOTAL_TOKENS = 4096
# The zoo's architectures registered up front: SGLang then imports only their model modules at
# start-up instead of all ~200 (minirl/sglang/models); any other architecture still loads.
MODELS_ENV = {"SGLANG_EXTERNAL_MODEL_PACKAGE": "minirl.sglang.models"}


class SglangUnavailable(RuntimeError):
    """SGLang cannot run here; the message is the one-line reason (tests skip with it)."""


@contextmanager
def _loader_bars() -> Iterator[None]:
    """SGLang's "Multi-thread loading shards" bar has no switch (rank 0 always draws it): inside
    ``minirl.quiet.quiet(progress=False)`` it is drawn disabled, as vLLM's and transformers' are."""
    from sglang.srt.model_loader import weight_utils

    from minirl.quiet import progress_enabled

    if progress_enabled():
        yield
        return
    original = weight_utils.tqdm

    class Silent(original):  # a subclass: SGLang calls tqdm._get_free_pos() on it too
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **{**kwargs, "disable": True})

    weight_utils.tqdm = Silent
    try:
        yield
    finally:
        weight_utils.tqdm = original


def unavailable_reason() -> str | None:
    """Why SGLang's CPU path cannot run on this machine, or None when it can."""
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not installed (pip install --no-deps -r requirements-sglang.txt, Linux x86-64)"
    if platform.system() != "Linux":
        return f"SGLang runs on Linux only (this is {platform.system()})"
    return None


@dataclass
class Step:
    """One forward of the runner: the sampled ids [B], the raw next-token logprobs [B, V]
    (log-softmax of the logits, taken before sampling: SGLang's sampler overwrites its logits in
    place with temperature-scaled probabilities), SGLang's logits output and the batch."""

    next_ids: torch.Tensor
    logprobs: torch.Tensor
    output: object
    batch: object


class SglangRunner:
    """An in-process SGLang ``ModelRunner`` on one checkpoint. ``model_runner`` is SGLang's own
    object (what ``aligntools.capture`` hooks); ``prefill`` / ``decode`` run one batched step."""

    def __init__(self, path: str | os.PathLike, dtype: str, max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS) -> None:
        reason = unavailable_reason()
        if reason:
            raise SglangUnavailable(reason)
        install()
        for key, value in MODELS_ENV.items():
            os.environ.setdefault(key, value)
        from minirl.quiet import install_filters

        install_filters()
        from sglang.benchmark import one_batch
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.distributed import bootstrap
        from sglang.srt.entrypoints.engine import _set_envs_and_config
        from sglang.srt.runtime_context import SpawnRanks, get_device, publish, spawn_world_rank
        from sglang.srt.server_args import PortArgs, ServerArgs

        self.path, self.dtype, self.max_total_tokens = str(path), dtype, max_total_tokens
        args = ServerArgs(model_path=self.path, dtype=dtype, max_total_tokens=max_total_tokens, **SETTINGS)
        args.resolve_once()
        _set_envs_and_config(args)
        ports = PortArgs.init_new(args)
        # Last publish wins: a second runner in this process re-projects SGLang's global config.
        publish(args, role="scheduler", ranks=SpawnRanks(world_rank=spawn_world_rank(args, tp_rank=0, pp_rank=0),
                                                         gpu_id=0))
        one_batch._init_process_global_configs()
        config = ModelConfig.from_server_args(args)
        if not bootstrap._PARALLEL_INITIALISED:  # world size 1: its groups serve every runner of the process
            bootstrap.init_parallel_runtime(server_args=args, device=get_device().device, dist_port=ports.nccl_port)
        bootstrap.init_layer_runtime(model_config=config)
        _forget_expert_layout()
        with _loader_bars():
            runner = one_batch.ModelRunner(model_config=config, mem_fraction_static=SETTINGS["mem_fraction_static"],
                                           gpu_id=0, nccl_port=ports.nccl_port, server_args=args)
        runner.alloc_memory_pool()
        runner.init_attention_backends()
        runner.init_cuda_graphs()  # disabled: sets the eager runners forward() dispatches to
        self.model_runner, self.server_args, self._one_batch = runner, args, one_batch
        self.hf_config = runner.model_config.hf_config
        self._rid = 0

    @property
    def model(self) -> torch.nn.Module:
        return self.model_runner.model

    def requests(self, prompts: list[list[int]], logprob_start: int | None = 0, **sampling: object) -> list:
        """SGLang ``Req``s for ``prompts``; ``logprob_start``: the first prompt position whose
        logits are computed (0: every position, for captures and prompt logprobs; None: only
        the last, as a plain rollout prefill)."""
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        total = sum(len(p) for p in prompts)
        if total > self.max_total_tokens:
            raise ValueError(f"{len(prompts)} prompts of {total} tokens do not fit SGLang's KV pool "
                             f"(max_total_tokens={self.max_total_tokens}); pass fewer prompts per call")
        reqs = []
        for prompt in prompts:
            params = SamplingParams(**{"temperature": 0.0, "max_new_tokens": 1, **sampling})
            params.normalize(None)
            req = Req(rid=str(self._rid), origin_input_text="", origin_input_ids=array("q", prompt),
                      sampling_params=params, return_logprob=logprob_start is not None)
            req.logprob_start_len = logprob_start if logprob_start is not None else -1
            req.full_untruncated_fill_ids = req.origin_input_ids
            req.extend_end = len(prompt)
            self._rid += 1
            reqs.append(req)
        return reqs

    @torch.no_grad()
    def prefill(self, reqs: list) -> Step:
        """One prefill (SGLang's extend) of ``reqs``, as ``one_batch.extend`` builds it; the KV
        stays in the pool for ``decode``."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.runtime_context import get_schedule
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        ob, runner = self._one_batch, self.model_runner
        cache = ob.TreeCacheNamespace(page_size=get_schedule().page_size, device=runner.device,
                                      token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator)
        batch = ScheduleBatch.init_new(reqs=reqs, req_to_token_pool=runner.req_to_token_pool,
                                       token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
                                       tree_cache=cache, model_config=runner.model_config, enable_overlap=False,
                                       spec_algorithm=SpeculativeAlgorithm.NONE)
        batch.prepare_for_extend()
        if batch.input_ids is None and getattr(batch, "prefill_input_ids_cpu", None) is not None:
            batch.input_ids, batch.prefill_input_ids_cpu = batch.prefill_input_ids_cpu.to(batch.device), None
        return self._forward(batch)

    @torch.no_grad()
    def decode(self, ids: torch.Tensor, batch: object) -> Step:
        """One decode step feeding ``ids`` [B] to the requests of ``batch``."""
        batch.input_ids = ids.to(torch.int64)
        batch.prepare_for_decode()
        return self._forward(batch)

    def _forward(self, batch: object) -> Step:
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        forward_batch = ForwardBatch.init_new(batch, self.model_runner, return_hidden_states_before_norm=False)
        output = self.model_runner.forward(forward_batch).logits_output
        raw = torch.log_softmax(output.next_token_logits.float(), dim=-1)  # a new tensor: sampling leaves it be
        return Step(self.model_runner.sample(output, forward_batch), raw, output, batch)

    def clear(self) -> None:
        """Free every request's KV slots (between batches: the pool holds max_total_tokens)."""
        self.model_runner.req_to_token_pool.clear()
        self.model_runner.token_to_kv_pool_allocator.clear()

    def load_weights(self, weights: dict[str, torch.Tensor] | list[tuple[str, torch.Tensor]]) -> None:
        """SGLang's own weight update (``update_weights_from_tensor``: the model's
        ``load_weights`` renames, fuses qkv / gate_up / experts and casts)."""
        pairs = list(weights.items()) if isinstance(weights, dict) else list(weights)
        ok, message = self.model_runner.weight_updater.update_weights_from_tensor([(k, v.detach()) for k, v in pairs])
        if not ok:
            raise RuntimeError(f"SGLang refused the weight update: {message}")

    def settings(self) -> dict[str, object]:
        """What a report records about this engine: SGLang's version and the settings above."""
        import sglang

        return {"sglang_version": sglang.__version__, "dtype": self.dtype, "max_total_tokens": self.max_total_tokens,
                **{k: v for k, v in SETTINGS.items() if k != "skip_tokenizer_init"},
                "SGLANG_USE_CPU_ENGINE": os.environ.get("SGLANG_USE_CPU_ENGINE")}


def _forget_expert_layout() -> None:
    """SGLang keeps one process-wide expert-location table, set by the first MoE runner and
    asserted empty by the next: clear it so runners can come and go in one process (tests, the
    gate, RL). The newest runner's table wins, as its published config does."""
    from sglang.srt.eplb import expert_location

    expert_location.get_resources().expert_location_metadata = None


def create_runner(path: str | os.PathLike, dtype: str, **options: object) -> SglangRunner:
    """An in-process SGLang runner on checkpoint ``path`` in ``dtype`` (options: the ``sglang``
    row of ``minirl.engines.KINDS``)."""
    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json; give a transformers checkpoint directory")
    return SglangRunner(path, dtype, **options)

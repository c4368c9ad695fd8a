"""Find a decoder model's parts by the role they play, not by class name.

Why roles: transformers has one class per architecture (LlamaAttention, Qwen3MoeAttention,
OlmoeAttention, ...) and inference engines have their own; what they share is structure.
A decoder stack is the ModuleList whose items each hold an attention block (q/k/v/o
projections, or a fused qkv) and an MLP; the router is the MLP's ``gate``/``router`` beside
its ``experts``; pre-norms are the layer's input norm and the MLP's pre-norm, which the
family's block shape names (``minirl.families``: ``post_attention_layernorm`` in a Llama
block, ``pre_feedforward_layernorm`` in Gemma 2/3's sandwich, none in a parallel block). The same finder
serves transformers models and vLLM/SGLang-style module trees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

ATTN_NORM_NAMES = ("input_layernorm", "attention_norm", "ln_1")
MLP_NAMES = ("mlp", "block_sparse_moe", "feed_forward", "moe")
ROUTER_NAMES = ("gate", "router")
FINAL_NORM_NAMES = ("norm", "final_layernorm", "ln_f", "final_norm", "final_layer_norm")


@dataclass
class LayerRoles:
    index: int
    layer: nn.Module
    attn: nn.Module
    mlp: nn.Module | None
    attn_norm: nn.Module | None
    mlp_norm: nn.Module | None
    router: nn.Module | None

    @property
    def fused_qkv(self) -> nn.Module | None:
        """The one GEMM that makes q, k and v, where the attention has one: ``qkv_proj`` (vLLM,
        Phi-3: [q | k | v]) or ``query_key_value`` (GPT-NeoX, BLOOM, Falcon: grouped per kv head)."""
        for name in ("qkv_proj", "query_key_value"):
            if isinstance(getattr(self.attn, name, None), nn.Module):
                return getattr(self.attn, name)
        return None

    def fused_v(self, qkv: torch.Tensor) -> torch.Tensor:
        """v [..., kv_size] out of the fused projection's output [..., q + 2 kv]."""
        if hasattr(self.attn, "qkv_proj"):
            return split_qkv(qkv, *qkv_sizes(self.attn))[2]
        return grouped_v(self.attn, qkv)


def grouped_v(attn: nn.Module, qkv: torch.Tensor) -> torch.Tensor:
    """v out of a ``query_key_value`` output laid out per kv head as [q heads of the group | k | v]:
    GPT-NeoX, BLOOM and classic Falcon have one q head per group (``[q_h | k_h | v_h]``), Falcon's
    new decoder architecture ``heads / kv_heads`` of them, multi-query Falcon one group of all.
    v is each group's last head. The head size is ``head_size`` (GPT-NeoX) or ``head_dim``; the
    group count is ``num_kv_heads`` (Falcon) or, without GQA, ``width / (3 * head)``."""
    head = getattr(attn, "head_size", None) or attn.head_dim
    groups = getattr(attn, "num_kv_heads", None) or qkv.shape[-1] // (3 * head)
    return qkv.unflatten(-1, (groups, -1))[..., -head:].flatten(-2)


def qkv_sizes(attn: nn.Module) -> tuple[int, int]:
    """(q_size, kv_size) of a fused-qkv attention: vLLM's own attention says them; a transformers
    attention inside vLLM's Transformers backend only has the fused ``QKVParallelLinear``'s
    ``output_sizes`` (q, k, v); transformers' own fused attention (Phi-3's ``qkv_proj``, one
    ``nn.Linear``) has its heads and ``head_dim``."""
    if hasattr(attn, "q_size"):
        return attn.q_size, attn.kv_size
    if hasattr(attn.qkv_proj, "output_sizes"):
        q, k, _ = attn.qkv_proj.output_sizes
        return q, k
    kv = attn.num_key_value_heads * attn.head_dim
    return attn.qkv_proj.out_features - 2 * kv, kv


def split_qkv(qkv: torch.Tensor, q_size: int, kv_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused ``qkv`` [T, q_size + 2 kv_size] -> q [T, q_size], k, v [T, kv_size]."""
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    return q, k, v


@dataclass
class ModelRoles:
    layers: list[LayerRoles]
    embed: nn.Module | None
    final_norm: nn.Module | None
    lm_head: nn.Module | None


def is_attention(m: nn.Module) -> bool:
    """q/k/v/o projections, a fused qkv projection and an output projection (GPT-NeoX's
    ``query_key_value`` and ``dense``), or multi-head
    latent attention's (DeepSeek-V3, BailingHybrid's full-attention layers: q, a joint kv
    down-projection, o)."""
    has = lambda *names: all(hasattr(m, n) for n in names)  # noqa: E731
    return (has("q_proj", "k_proj", "v_proj", "o_proj") or has("qkv_proj", "o_proj") or has("query_key_value", "dense")
            or (has("kv_a_proj_with_mqa", "o_proj") and (has("q_proj") or has("q_a_proj"))))


def find_roles(model: nn.Module, config: object | None = None) -> ModelRoles | None:
    """Roles of ``model``'s decoder stack, or None when it has no recognisable layers."""
    best: tuple[str, nn.ModuleList] | None = None
    for path, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) and all(_attention_child(x) is not None for x in mod):
            if best is None or len(mod) > len(best[1]):
                best = (path, mod)
    if best is None:
        return None
    path, stack = best
    from minirl.families import expert_count, family  # here: importing aligntools imports no minirl

    n_experts, mlp_norms = expert_count(config), family(config).mlp_norm_names
    layers = [_layer_roles(i, layer, n_experts, mlp_norms) for i, layer in enumerate(stack)]
    holder = model.get_submodule(path.rpartition(".")[0]) if "." in path else model
    return ModelRoles(layers=layers, embed=_embed(model, holder), final_norm=_child(holder, FINAL_NORM_NAMES),
                      lm_head=_lm_head(model))


def _attention_child(layer: nn.Module) -> nn.Module | None:
    for child in layer.children():
        if is_attention(child):
            return child
    return None


def _layer_roles(index: int, layer: nn.Module, n_experts: int | None,
                 mlp_norms: tuple[str, ...] | None) -> LayerRoles:
    """``mlp_norms``: the family's names of the MLP's pre-norm (``minirl.families``), None for
    blocks without one (parallel, post-norm): their ``resid_mid``/``mlp_norm`` sites do not exist."""
    mlp = _child(layer, MLP_NAMES)
    attn_norm = _child(layer, ATTN_NORM_NAMES)
    mlp_norm = _child(layer, mlp_norms) if mlp_norms is not None and attn_norm is not None else None
    return LayerRoles(index=index, layer=layer, attn=_attention_child(layer), mlp=mlp,
                      attn_norm=attn_norm, mlp_norm=mlp_norm, router=_router(mlp, n_experts))


def _router(mlp: nn.Module | None, n_experts: int | None) -> nn.Module | None:
    """The MoE gate: beside ``experts``, with one output row per expert."""
    if mlp is None or not hasattr(mlp, "experts"):
        return None
    gate = _child(mlp, ROUTER_NAMES)
    weight = getattr(gate, "weight", None)
    if gate is None or weight is None or weight.dim() != 2:
        return None
    if n_experts is not None and weight.shape[0] != n_experts:
        return None
    return gate


def _child(parent: nn.Module, names: tuple[str, ...]) -> nn.Module | None:
    for name in names:
        child = getattr(parent, name, None)
        if isinstance(child, nn.Module):
            return child
    return None


def _embed(model: nn.Module, holder: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_input_embeddings", None)
    if get is not None:
        try:
            found = get()
        except (NotImplementedError, AttributeError, TypeError):  # vLLM's takes input ids
            found = None
        if isinstance(found, nn.Module):
            return found
    return _child(holder, ("embed_tokens", "embedding", "embed_in", "wte", "tok_embeddings"))  # vLLM gpt-oss, GPT-NeoX


def _lm_head(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    if get is not None:
        try:
            found = get()
        except (NotImplementedError, AttributeError):
            found = None
        if isinstance(found, nn.Module):
            return found
    return _child(model, ("lm_head", "output"))

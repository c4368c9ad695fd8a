"""Tiny random checkpoints of every architecture family in docs/models.md's table.

Why random and untrained: the checks here compare engines running *the same* weights, so any
weights do, as long as nothing that differs between engines is hidden by an init value: norm
weights (and biases) are pushed off their init (a ``1 + weight`` RMSNorm read as ``weight``
would otherwise agree), and every shape is the one vLLM's CPU attention takes (head_dim 32;
24 is rejected). 2 layers, hidden 128, the zoo's tokenizer (vocab 512), float32 on disk.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

#: Shapes every family shares (names differ per config class; the rest is per family below).
COMMON = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, max_position_embeddings=256, vocab_size=512,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
#: An override that removes a COMMON key the family's config cannot take (Falcon's head_dim is derived).
DROP = object()
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)

#: model_type -> config overrides beyond COMMON.
FAMILIES: dict[str, dict] = {
    "llama": {}, "mistral": {"sliding_window": None}, "qwen2": {}, "qwen3": {},
    "qwen2_moe": {**MOE, "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1},
    "qwen3_moe": {**MOE, "decoder_sparse_step": 1},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "olmoe": {"num_experts": 4, "num_experts_per_tok": 2},
    "phi3": {}, "glm4": {}, "glm": {},
    "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2, "layer_types": ["sliding_attention", "full_attention"],
                "sliding_window": 64},
    "deepseek_v3": {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "kv_lora_rank": 32,
                    "q_lora_rank": None, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 32,
                    "head_dim": 16},  # RoPE runs over qk_rope_head_dim
    "gemma": {}, "gemma2": {"tie_word_embeddings": True}, "gemma3_text": {"tie_word_embeddings": True},
    "granite": {"logits_scaling": 8.0, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                "attention_multiplier": 0.03125},
    "granitemoe": {"num_local_experts": 4, "num_experts_per_tok": 2, "logits_scaling": 8.0,
                   "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.03125},
    "cohere": {"logit_scale": 0.0625}, "cohere2": {"logit_scale": 0.0625, "sliding_window": 64},
    "stablelm": {}, "olmo2": {}, "olmo3": {}, "starcoder2": {}, "smollm3": {}, "seed_oss": {}, "arcee": {},
    # GPT-NeoX has no GQA: its query_key_value makes every head's k and v, but vLLM's Transformers
    # backend believes a num_key_value_heads the config carries (attention rel. L2 1.2 at 2 of 4)
    "gpt_neox": {"num_key_value_heads": 4},
}

#: Families outside the table that transformers and vLLM both register (docs/models.md's second
#: table): each is either served with its numbers or refused by the invariant it fails. The
#: multipliers are set off 1 so that a reader that ignores one shows it.
OUTSIDE: dict[str, dict] = {
    "gpt2": {}, "bloom": {}, "opt": {}, "falcon": {"new_decoder_architecture": True, "head_dim": DROP},
    "exaone4": {"sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"]},
    "falcon_h1": {"lm_head_multiplier": 0.5, "embedding_multiplier": 3.0, "mamba_d_ssm": 128,
                  "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_state": 16},
    "granitemoeshared": {"num_local_experts": 4, "num_experts_per_tok": 2, "logits_scaling": 8.0,
                         "embedding_multiplier": 12.0, "shared_intermediate_size": 64},
    "granitemoehybrid": {"num_local_experts": 4, "num_experts_per_tok": 2, "logits_scaling": 8.0,
                         "embedding_multiplier": 12.0, "shared_intermediate_size": 64,
                         "layer_types": ["attention", "attention"]},
    "cohere2_moe": {**MOE, "logit_scale": 0.0625, "sliding_window": 64,
                    "layer_types": ["sliding_attention", "full_attention"]},
    "nemotron": {}, "apertus": {}, "ernie4_5": {}, "ministral3": {}, "internlm3": {}, "phi": {}, "olmo": {},
    "hunyuan_v1_dense": {}, "lfm2": {"layer_types": ["conv", "full_attention"]},
    "ernie4_5_moe": {"moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 64, "moe_num_shared_experts": 1},
    "glm4_moe": {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                 "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1},
    "exaone_moe": {**MOE, "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"]},
    "llama4_text": {"num_local_experts": 4, "intermediate_size_mlp": 256, "moe_layers": [1],
                    "layer_types": ["chunked_attention", "full_attention"], "attention_chunk_size": 64},
    "falcon_mamba": {}, "nemotron_h": {"n_routed_experts": 4, "moe_intermediate_size": 64,
                                       "moe_shared_expert_intermediate_size": 64},
}


def build(model_type: str, out: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    """Write a tiny random ``model_type`` checkpoint (config, safetensors, the zoo's tokenizer)
    to ``out`` and return it; an existing complete one is reused."""
    from filelock import FileLock

    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):  # two xdist workers may ask for one family
        if not (out / "model.safetensors").exists():
            _write(model_type, out, tokenizer_from, seed)
    return out


def _write(model_type: str, out: Path, tokenizer_from: Path, seed: int) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {**COMMON, **{**FAMILIES, **OUTSIDE}[model_type]}
    config = AutoConfig.for_model(model_type, **{k: v for k, v in kwargs.items() if v is not DROP})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # off the init, so a norm read with the wrong convention shows
                p.add_(0.2 * torch.randn_like(p))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / f, tmp / f)
    tmp.rename(out)

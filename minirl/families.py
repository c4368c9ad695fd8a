"""One contract per architecture family: what the model computes between its modules.

Why a table: every engine computes the same model, but not in the same modules. transformers'
Gemma embedding module returns the embedding already times √hidden while vLLM's returns it
unscaled and multiplies in the model's forward; Granite divides the logits by
``logits_scaling`` and Cohere multiplies them by ``logit_scale`` after ``lm_head`` (transformers
in the model's forward, vLLM in ``compute_logits``); Gemma 2/3 soft-cap them. A capture that
reads a module output, and a trainer that computes ``log_softmax(h @ lm_head.T)``, see different
tensors under one name unless someone says what each site *means*. This module says it, once,
for every reader: the capture adapters (aligntools' hf/vllm/fused), the RL trainer's fused
log-prob path, vLLM's weight sync and the minirl engine. It imports nothing, so any layer may
read it.

What the sites mean (the same on every engine):
  * ``embed``: what the first layer adds to, i.e. after any embedding scale;
  * ``logits``: what is softmaxed, i.e. after any scaling and soft-capping;
  * ``resid_mid`` / ``resid_post``: the residual stream after attention / after the layer;
  * ``mlp_norm``: the norm whose output feeds the MLP (``pre_feedforward_layernorm`` in a
    sandwich block); blocks without one (parallel, post-norm) have no ``resid_mid``/``mlp_norm``.

Public surface: ``Family`` (one entry), ``FAMILIES`` (by ``model_type``), ``family(config)``,
``has_entry(config)``, ``embed_scale(config)``, ``LogitsTransform`` / ``logits_transform(config)``,
``expert_count(config)``, ``FamilyConfigError``. A new family is one ``Family`` entry here plus its
test in tests/families/ (docs/models.md).

A family without an entry is read as the Llama shape (``DEFAULT``), but never trusted on that
alone: ``aligntools.invariants`` proves on every checkpoint the lab loads that the readers above
compute what the model's own forward computes, and refuses the model where they do not.

Every config value read here is read as the model reads it or refused naming its key
(``FamilyConfigError``): a scale of 0, NaN or a string is never taken for 1, and a multimodal
config (Gemma 3) is read through its text config.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Literal

#: How a decoder layer is wired.
#:  * ``pre_norm``: x + attn(norm1(x)), then + mlp(norm2(.)) (Llama, Qwen, Mixtral, Granite, ...);
#:  * ``sandwich``: as pre_norm, with the attention and MLP outputs normed again before the add
#:    (Gemma 2/3: ``post_attention_layernorm`` normalises the attention output, the MLP's
#:    pre-norm is ``pre_feedforward_layernorm``);
#:  * ``post_norm``: x + norm(attn(x)), then + norm(mlp(.)) (OLMo 2/3): no pre-norm sites;
#:  * ``parallel``: x + attn(norm(x)) + mlp(norm(x)) (Cohere, GPT-NeoX): one norm, no
#:    ``resid_mid``/``mlp_norm``.
BlockShape = Literal["pre_norm", "sandwich", "post_norm", "parallel"]

#: Which module of a layer, by attribute name, is the MLP's pre-norm, per block shape (None: none).
MLP_NORM_BY_BLOCK: dict[str, tuple[str, ...] | None] = {
    "pre_norm": ("post_attention_layernorm", "ffn_norm", "ln_2"),
    "sandwich": ("pre_feedforward_layernorm",),
    "post_norm": None,
    "parallel": None,
}


@dataclass(frozen=True)
class LogitsTransform:
    """What the model's forward applies to ``lm_head``'s output before the softmax, in its order:
    ``* multiply``, ``/ divide``, then ``tanh(z / softcap) * softcap``. Kept as the model writes
    them (Granite divides, Cohere multiplies) so an fp32 capture reproduces its bits."""

    multiply: float = 1.0
    divide: float = 1.0
    softcap: float | None = None

    @property
    def identity(self) -> bool:
        return self.multiply == 1.0 and self.divide == 1.0 and self.softcap is None

    @property
    def scale(self) -> float:
        """The combined linear factor (``multiply / divide``), for kernels that fold it into a
        temperature."""
        return self.multiply / self.divide

    def apply(self, logits):
        """``logits`` (a tensor, ``lm_head``'s output) -> what the model softmaxes; a new tensor."""
        out = logits
        if self.multiply != 1.0:
            out = out * self.multiply
        if self.divide != 1.0:
            out = out / self.divide
        if self.softcap is not None:
            out = (out / self.softcap).tanh() * self.softcap
        return out


@dataclass(frozen=True)
class Family:
    """One architecture family's quirks (fields default to the Llama shape).

    ``embed_scale_attr``: the config attribute the embedding is multiplied by (``"sqrt_hidden"``
    for √hidden_size); ``hf_embed_scaled``: transformers' embedding *module* already applies it
    (Gemma's ``ScaledWordEmbedding``), so only other engines' captures scale theirs.
    ``logits_multiply_attr`` / ``logits_divide_attr`` / ``softcap_attr``: config attributes of
    the logits transform. ``vllm_layer_returns_sum``: vLLM's layer returns ``(hidden + residual,
    residual)`` rather than ``(delta, residual)``, so its first output already is the residual
    stream. (Whether vLLM serves a family through its Transformers backend is asked of vLLM's
    registry, not recorded here: ``minirl.vllm.llm``.)
    """

    model_type: str
    block: BlockShape = "pre_norm"
    embed_scale_attr: str | None = None
    hf_embed_scaled: bool = False
    logits_multiply_attr: str | None = None
    logits_divide_attr: str | None = None
    softcap_attr: str | None = None
    vllm_layer_returns_sum: bool = False

    @property
    def mlp_norm_names(self) -> tuple[str, ...] | None:
        return MLP_NORM_BY_BLOCK[self.block]


def _entries(*families: Family) -> dict[str, Family]:
    return {f.model_type: f for f in families}


_GEMMA = dict(embed_scale_attr="sqrt_hidden", hf_embed_scaled=True)
_GRANITE = dict(embed_scale_attr="embedding_multiplier", logits_divide_attr="logits_scaling")

#: Every family with a tested entry (docs/models.md has the table of what passes where).
FAMILIES: dict[str, Family] = _entries(
    Family("llama"), Family("mistral"), Family("qwen2"), Family("qwen3"), Family("qwen2_moe"),
    Family("qwen3_moe"), Family("mixtral"), Family("olmoe"), Family("phi3"), Family("glm4"),
    Family("gpt_oss"), Family("deepseek_v3"),
    Family("gemma", **_GEMMA),
    Family("gemma2", block="sandwich", softcap_attr="final_logit_softcapping", **_GEMMA),
    Family("gemma3_text", block="sandwich", softcap_attr="final_logit_softcapping", **_GEMMA),
    Family("gemma3", block="sandwich", softcap_attr="final_logit_softcapping", **_GEMMA),  # = gemma3_text
    Family("granite", **_GRANITE),
    Family("granitemoe", **_GRANITE),
    Family("cohere", block="parallel", logits_multiply_attr="logit_scale", vllm_layer_returns_sum=True),
    Family("cohere2", block="parallel", logits_multiply_attr="logit_scale", vllm_layer_returns_sum=True),
    Family("stablelm", vllm_layer_returns_sum=True),
    Family("olmo2", block="post_norm"),
    Family("olmo3", block="post_norm"),
    Family("starcoder2"),
    Family("smollm3"),
    Family("seed_oss"),
    Family("arcee"),
    Family("glm"),
    Family("gpt_neox", block="parallel"),
    Family("bailing_hybrid"),  # vLLM 0.32 has no BailingHybridForCausalLM: check_model refuses the architecture
    # outside docs/models.md's first table: post-norm blocks whose vLLM layer returns the sum (EXAONE 4),
    # logits and embeddings scaled after their modules (Falcon-H1, Granite's MoE variants, Cohere 2 MoE)
    Family("exaone4", block="post_norm", vllm_layer_returns_sum=True),
    Family("falcon_h1", embed_scale_attr="embedding_multiplier", logits_multiply_attr="lm_head_multiplier"),
    Family("granitemoeshared", **_GRANITE),
    Family("granitemoehybrid", vllm_layer_returns_sum=True, **_GRANITE),
    Family("cohere2_moe", block="parallel", logits_multiply_attr="logit_scale", vllm_layer_returns_sum=True),
)

#: What an unknown ``model_type`` is read as: a pre-norm block with no scaling anywhere; the
#: invariants (``aligntools.invariants``) decide whether that reading is right for a given model.
DEFAULT = Family("unknown")


class FamilyConfigError(ValueError):
    """A config value the family's readers cannot take as written (names the key and the fix)."""


#: Config keys that hold a MoE model's routed-expert count (DeepSeek-V3 says ``n_routed_experts``).
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def expert_count(config: object | dict | None) -> int | None:
    """Routed experts per MoE layer of a config (object or ``config.json`` dict); None: dense."""
    for key in EXPERT_COUNT_KEYS:
        value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def family(config: object | None) -> Family:
    """The entry for ``config.model_type`` (a transformers config or anything with that
    attribute), or ``DEFAULT`` (Llama-shaped) when the family has none: ``has_entry`` says which."""
    return FAMILIES.get(_model_type(config), DEFAULT)


def has_entry(config: object | None) -> bool:
    """Whether ``config``'s family has a tested entry (else the invariants alone vouch for it)."""
    return _model_type(config) in FAMILIES


def embed_scale(config: object | None) -> float | None:
    """The factor the model multiplies its token embedding by before the first layer, or None."""
    attr = family(config).embed_scale_attr
    if attr is None:
        return None
    text = _text_config(config)
    if attr == "sqrt_hidden":
        hidden = getattr(text, "hidden_size", None)
        if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden <= 0:
            raise FamilyConfigError(f"{_model_type(config)}: hidden_size = {hidden!r} in the config; the embedding "
                                    "is scaled by its square root, so it must be a positive int")
        return math.sqrt(hidden)
    value = _positive(config, attr)
    return None if value in (None, 1.0) else value


def logits_transform(config: object | None) -> LogitsTransform:
    """What ``config``'s model applies after ``lm_head`` (identity for most families)."""
    fam = family(config)
    multiply, divide, cap = (_positive(config, a) for a in (fam.logits_multiply_attr, fam.logits_divide_attr,
                                                             fam.softcap_attr))
    return LogitsTransform(multiply=1.0 if multiply is None else multiply,
                           divide=1.0 if divide is None else divide, softcap=cap)


def _model_type(config: object | None) -> str:
    value = getattr(config, "model_type", None)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise FamilyConfigError(f"model_type = {value!r} in the config: it must be a string naming the family "
                                "(e.g. \"llama\")")
    return value


def _text_config(config: object | None) -> object | None:
    """The config that holds the language model's fields: a multimodal config's text config
    (transformers' ``get_text_config``; Gemma 3 keeps ``hidden_size`` there), else ``config``."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _positive(config: object | None, attr: str | None) -> float | None:
    """``attr`` of the (text) config as a positive finite float; None where the family has no
    such field or the config leaves it unset. A bool, string, 0, negative, NaN or inf is refused
    by name: the model would compute with it (a scale of 0 makes every logit 0, a soft-cap of 0
    NaN), and a reader that took it for 1 would be silently wrong."""
    if attr is None:
        return None
    value = getattr(_text_config(config), attr, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0 \
            or not math.isfinite(1.0 / value):  # 1e-320: its reciprocal (a temperature) overflows
        raise FamilyConfigError(f"{_model_type(config)}: {attr} = {value!r} in the config; the lab reads it as a "
                                f"positive finite number (what the model's forward multiplies, divides or caps by). "
                                f"Fix {attr} in config.json")
    return float(value)

"""Planted faults: records of a known cause, made from a model, to check that the audit names it.

Why transformers' ``generate`` as the engine: its logits processors (temperature, top-k, top-p,
min-p, repetition penalty) are an implementation independent of the audit's own formulas, and its
``output_scores`` are exactly the processed logits an engine returns logprobs of. Each fault is
planted the way it happens in a run: the engine sampled with a setting the trainer does not apply,
saw another prompt, served other weights, computed in bf16, quantized layers it should not have, shifted its
list, or routed otherwise.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from aligntools.records import Record


@dataclass(frozen=True)
class Planted:
    """Records with a planted ``cause`` (None: clean), the ``truth`` of its parameter, and the
    ``old`` checkpoints to offer the audit."""

    records: list[Record]
    cause: str | None
    truth: object = None
    old: list = field(default_factory=list)


def generate(model: nn.Module, prompts: torch.Tensor, new: int, seed: int, **sampling: object) -> tuple:
    """Sample ``new`` tokens per prompt [B, P]; (completions [B, new], processed logprobs [B, new] float64)."""
    import transformers

    torch.manual_seed(seed)
    # no EOS: a stop token would need min_new_tokens, whose processor masks EOS (a truncation of its own)
    cfg = transformers.GenerationConfig(**{"do_sample": True, "top_k": 0, "top_p": 1.0, "temperature": 1.0,
                                           "max_new_tokens": new, "eos_token_id": None, "pad_token_id": 0,
                                           "output_scores": True, "return_dict_in_generate": True, **sampling})
    with torch.inference_mode():
        out = model.generate(prompts, generation_config=cfg)
    completions = out.sequences[:, prompts.shape[1]:]  # [B, new]
    # one step at a time: [B, new, V] in float64 would not fit for a real vocabulary
    return completions, torch.stack([torch.log_softmax(step.double(), -1).gather(-1, tok[:, None])[:, 0]
                                     for step, tok in zip(out.scores, completions.T)], 1)


def _records(prompts: torch.Tensor, completions: torch.Tensor, logprobs: torch.Tensor, **extra) -> list[Record]:
    return [Record(tuple(p.tolist()), tuple(c.tolist()), tuple(lp.tolist()), **extra)
            for p, c, lp in zip(prompts, completions, logprobs)]


def _prompts(model: nn.Module, n: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    vocab = model.get_output_embeddings().weight.shape[0]
    prompts = torch.randint(3, vocab, (n, length), generator=g)  # [n, length]
    if model.config.bos_token_id is not None:  # as a tokenizer with add_special_tokens would
        prompts[:, 0] = model.config.bos_token_id
    return prompts


def perturbed(model: nn.Module, scale: float, seed: int) -> nn.Module:
    """A copy of ``model`` with every weight moved by ``scale`` of its own std (an older checkpoint)."""
    old = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in old.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * p.std().nan_to_num(0.0))
    return old


SAMPLING_FAULTS: dict[str, tuple[str, dict, object]] = {
    "temperature": ("temperature", {"temperature": 0.7}, 0.7),
    "top_p": ("top_p", {"top_p": 0.9}, 0.9),
    "top_k": ("top_k", {"top_k": 20}, 20),
    "min_p": ("min_p", {"min_p": 0.1}, 0.1),
    "repetition_penalty": ("penalty", {"repetition_penalty": 1.3}, 1.3),
    "temperature+top_p": ("temperature", {"temperature": 0.7, "top_p": 0.9}, 0.7),
}
"""Fault -> (the cause to name first, transformers sampling settings, the planted value)."""


def plant(model: nn.Module, fault: str, n: int = 8, prompt_len: int = 8, new: int = 24, seed: int = 0) -> Planted:
    """Records of ``model`` with ``fault`` planted: ``"clean"``, a key of ``SAMPLING_FAULTS``, or one of
    ``token_shift``, ``bos_dropped``, ``stale_weights``, ``bf16``, ``bf16_lm_head``, ``quantized_layers``,
    ``routing`` (an MoE model)."""
    prompts = _prompts(model, n, prompt_len, seed)
    if fault in SAMPLING_FAULTS:
        cause, sampling, truth = SAMPLING_FAULTS[fault]
        return Planted(_records(prompts, *generate(model, prompts, new, seed, **sampling)), cause, truth)
    if fault not in BUILDERS:
        raise ValueError(f"unknown fault {fault!r}; known: clean, {', '.join([*SAMPLING_FAULTS, *BUILDERS])}")
    return BUILDERS[fault](model, prompts, new, seed)


def _clean(model: nn.Module, prompts: torch.Tensor, new: int, seed: int) -> Planted:
    return Planted(_records(prompts, *generate(model, prompts, new, seed)), None)


def _token_shift(model: nn.Module, prompts: torch.Tensor, new: int, seed: int) -> Planted:
    completions, lp = generate(model, prompts, new + 1, seed)
    return Planted(_records(prompts, completions[:, :new], lp[:, 1:]), "token_shift", 1)


def _bos_dropped(model: nn.Module, prompts: torch.Tensor, new: int, seed: int) -> Planted:
    completions, lp = generate(model, prompts[:, 1:], new, seed)
    return Planted(_records(prompts, completions, lp), "prompt_mismatch", "bos_dropped")


def _stale(model: nn.Module, prompts: torch.Tensor, new: int, seed: int) -> Planted:
    served, decoy = perturbed(model, 0.05, seed + 1), perturbed(model, 0.05, seed + 2)
    return Planted(_records(prompts, *generate(served, prompts, new, seed)), "stale_weights", "old[0]", [served, decoy])


def _bf16(model: nn.Module, prompts: torch.Tensor, new: int, seed: int) -> Planted:
    return Planted(_records(prompts, *generate(copy.deepcopy(model).to(torch.bfloat16), prompts, new, seed)), "numeric")


class _Bf16Head(nn.Module):
    """An lm_head computed in bf16 (hidden state and weight rounded, the GEMM's output in bf16), read as
    float32, every other layer in fp32: an engine whose only low-precision op is the lm_head GEMM (minirl's
    ``Knobs(lm_head_dtype="bfloat16")`` with fp32 activations)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().to(torch.bfloat16), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [B, S, H] -> [B, S, V]
        return nn.functional.linear(hidden.to(torch.bfloat16), self.weight).float()


def _bf16_lm_head(model: nn.Module, prompts: torch.Tensor, new: int, seed: int) -> Planted:
    served = copy.deepcopy(model)
    served.set_output_embeddings(_Bf16Head(model.get_output_embeddings().weight))
    return Planted(_records(prompts, *generate(served, prompts, new, seed)), "numeric", "bf16 lm_head")


def _quantized(model: nn.Module, prompts: torch.Tensor, new: int, seed: int) -> Planted:
    """The engine served the MLP matrices (MoE: the experts; not the router) in fp8 e4m3 with a scale per
    output channel, the trainer's are fp32: an FP8 checkpoint whose ``modules_to_not_convert`` missed them
    (vLLM PR #44628). Picked by name here, by role in the audit."""
    from minirl import fake_quantize

    served = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in served.named_parameters():
            if ".mlp." in name and p.ndim >= 2 and not name.endswith(".mlp.gate.weight"):
                p.copy_(fake_quantize(p, "fp8_e4m3", name))
    return Planted(_records(prompts, *generate(served, prompts, new, seed)), "quantized_layers", "fp8_e4m3 on mlp")


def _routing(model: nn.Module, prompts: torch.Tensor, new: int, seed: int, rate: float = 0.1) -> Planted:
    """The engine routed ``rate`` of (token, layer) pairs to another expert: its logprobs are the model's
    with those experts forced, its recorded experts the forced ones."""
    from aligntools.audit.score import score

    completions, _ = generate(model, prompts, new, seed)
    p_list, c_list = prompts.tolist(), completions.tolist()
    own = score(model, p_list, c_list).routing
    rng = np.random.default_rng(seed)
    flipped = [_flip(ids, rate, model.config.num_experts, rng) for ids in own]
    lp = torch.log_softmax(score(model, p_list, c_list, forced=flipped).logits.double(), -1)
    lp = lp.gather(-1, completions.reshape(-1, 1))[:, 0].reshape(completions.shape)
    return Planted([Record(tuple(p), tuple(c), tuple(x.tolist()), routed_experts=e)
                    for p, c, x, e in zip(p_list, c_list, lp, flipped)], "routing", rate)


def _flip(ids: np.ndarray, rate: float, experts: int, rng: np.random.Generator) -> np.ndarray:
    """``ids`` [S, layers, top_k] with the last expert of ``rate`` of the (token, layer) rows replaced
    by one outside the row."""
    out = ids.copy()
    for s, layer in zip(*np.nonzero(rng.random(ids.shape[:2]) < rate)):
        out[s, layer, -1] = rng.choice(sorted(set(range(experts)) - set(ids[s, layer].tolist())))
    return out


BUILDERS: dict[str, Callable[..., Planted]] = {
    "clean": _clean, "token_shift": _token_shift, "bos_dropped": _bos_dropped, "stale_weights": _stale,
    "bf16": _bf16, "bf16_lm_head": _bf16_lm_head, "quantized_layers": _quantized, "routing": _routing,
}

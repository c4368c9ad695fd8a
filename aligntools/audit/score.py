"""The trainer's side: score the recorded tokens with the model, read its routing, replay the
engine's routing.

Why one sequence per forward: records differ in length, and padding would add a numeric path the
trainer of the run may not have (attention masks, pad positions); batch 1 is the trainer's logprob
of each token given exactly the recorded prefix.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from aligntools.audit.logits import HOLD_ELEMENTS, Logits, token_logprob


def load_model(model: str | os.PathLike | nn.Module, dtype: torch.dtype = torch.float32) -> nn.Module:
    """``model`` (an HF checkpoint directory or an ``nn.Module``) in eval mode and ``dtype``; a
    module is copied when its dtype differs, never changed in place."""
    if isinstance(model, nn.Module):
        current = next(model.parameters()).dtype
        loaded = model if current == dtype else copy.deepcopy(model).to(dtype)
    else:
        import transformers

        from aligntools.gates.inputs import validate_checkpoint

        loaded = transformers.AutoModelForCausalLM.from_pretrained(validate_checkpoint(model), dtype=dtype)
    if dtype == torch.float64 and getattr(loaded.config, "_experts_implementation", None) not in (None, "eager"):
        loaded.set_experts_implementation("eager")  # grouped_mm has no float64 kernel (as mlab check)
    return loaded.eval()


@dataclass
class Scores:
    """``rows``: the logits [N, V] (fp32; float64 for a float64 model), one row per completion token of every
    record, in record order, as ``Logits`` (held, or as hidden states past ``HOLD_ELEMENTS``);
    ``routing``: per record the trainer's top-k expert ids [S, layers, top_k] (S = prompt + completion - 1),
    and its router margin (k-th minus (k+1)-th logit) [S, layers], or None for a dense model."""

    rows: Logits
    routing: list[np.ndarray] | None
    margins: list[np.ndarray] | None

    @property
    def logits(self) -> torch.Tensor:
        """[N, V]: every row (a small model's records)."""
        return self.rows.full()


def score(model: nn.Module, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
          forced: Sequence[np.ndarray] | None = None, progress: bool = False) -> Scores:
    """The model's logits at every completion token of each (prompt, completion); with ``forced``
    (per record [>= S, layers, top_k] expert ids) the routers use those experts (routing replay, R3).
    ``progress``: a bar per record on stderr (the audit's first forward is half its time: 68 s of 136 s
    for 64 x 256 tokens of smollm2-135m)."""
    from tqdm.auto import tqdm

    routers = _routers(model)
    head = model.get_output_embeddings()
    hold = sum(map(len, completions)) * head.weight.shape[0] <= HOLD_ELEMENTS
    inputs: list[torch.Tensor] = []
    grab = head.register_forward_pre_hook(lambda m, args: inputs.append(args[0][0]))  # [C, H] at lm_head
    rows, lps, routing, margins = [], [], [], []
    try:
        bar = tqdm(zip(prompts, completions), total=len(prompts), desc="trainer forward", unit="record",
                   disable=not progress)
        for i, (prompt, completion) in enumerate(bar):
            ids = torch.tensor([list(prompt) + list(completion)[:-1]])  # [1, S]
            taps = _Taps(routers, None if forced is None else forced[i][: ids.shape[1]])
            with taps, torch.inference_mode():
                logits = model(input_ids=ids, logits_to_keep=len(completion)).logits[0]  # [C, V]: completion rows
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 read as fp32; fp64 kept
            lps.append(token_logprob(logits, torch.tensor(completion)))
            hold = hold or (i == 0 and not _projects(head, inputs[-1], logits))  # checked once, on the first record
            rows.append(logits if hold else inputs[-1])
            if routers:
                routing.append(np.stack(taps.ids, axis=1))  # [S, layers, top_k]
                margins.append(np.stack(taps.margins, axis=1))  # [S, layers]
    finally:
        grab.remove()
    tokens = torch.tensor([t for c in completions for t in c])
    weight, bias = (None, None) if hold else (head.weight.detach(), None if head.bias is None else head.bias.detach())
    out = Logits(torch.cat(rows), tokens, weight, bias, torch.cat(lps))  # source [N, V] held, or [N, H]
    return Scores(out, routing if routers else None, margins if routers else None)


def _projects(head: nn.Module, hidden: torch.Tensor, logits: torch.Tensor) -> bool:
    """Whether the model's logits [C, V] are ``head``'s plain projection of ``hidden`` [C, H] (no softcap,
    no scale), to the float rounding of an H-term dot product: |err| <= H * eps * (|h| @ |W|^T)."""
    if not isinstance(head, nn.Linear) or hidden.dtype != logits.dtype:
        return False
    with torch.inference_mode():
        again = nn.functional.linear(hidden, head.weight, head.bias)  # [C, V]
        bound = hidden.shape[1] * torch.finfo(logits.dtype).eps * (hidden.abs() @ head.weight.abs().T + 1e-30)
        return bool(((again - logits).abs() <= bound).all())


def _routers(model: nn.Module) -> list[nn.Module]:
    from aligntools.adapters.roles import find_roles

    roles = find_roles(model, getattr(model, "config", None))
    return [lr.router for lr in roles.layers if lr.router is not None] if roles else []


class _Taps:
    """Forward hooks on the routers: record each layer's top-k ids and margin; with ``forced``
    [S, layers, top_k], replace the ids by the recorded ones and their weights by the router's
    softmax at those ids (renormalised as the model does)."""

    def __init__(self, routers: list[nn.Module], forced: np.ndarray | None) -> None:
        self.routers, self.forced = routers, forced
        self.ids: list[np.ndarray] = []
        self.margins: list[np.ndarray] = []
        self.handles: list = []

    def __enter__(self) -> _Taps:
        for layer, router in enumerate(self.routers):
            self.handles.append(router.register_forward_hook(lambda m, a, out, layer=layer: self._hook(layer, out)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()

    def _hook(self, layer: int, out: object) -> object:
        if not (isinstance(out, tuple) and len(out) == 3 and not out[2].is_floating_point()):
            raise ValueError("the audit reads routing from transformers-5 routers returning (logits, weights, ids); "
                             f"this model's router returns {type(out).__name__}")
        logits, weights, ids = out  # [S, E], [S, K], [S, K]
        k = ids.shape[-1]
        top = logits.float().topk(min(k + 1, logits.shape[-1]), dim=-1).values  # [S, K + 1]
        self.ids.append(ids.numpy().copy())
        self.margins.append((top[:, k - 1] - top[:, -1]).numpy())
        if self.forced is None:
            return None
        forced = torch.as_tensor(self.forced[:, layer], dtype=ids.dtype)  # [S, K]
        chosen = logits.float().softmax(-1).gather(-1, forced)  # [S, K]
        if getattr(self.routers[layer], "norm_topk_prob", True):  # Mixtral always renormalises; Qwen3 by config
            chosen = chosen / chosen.sum(-1, keepdim=True)
        return logits, chosen.to(weights.dtype), forced

"""Router replay for transformers MoE models (Qwen3-MoE, Mixtral).

CompassMax §2.4.4: the train-infer log-prob gap of an MoE is dominated by tokens whose router
picks different experts in the two engines; replaying the inference engine's choice in the
trainer cuts it by about 10x. Two flavours:

* **R3** replays the rollout engine's experts (``Rollout.prompt_routed_experts`` +
  ``routed_experts``) in every trainer forward of the step.
* **R2** records the trainer's own top-k during the old-logprob forward and replays it in the
  update's forwards, so pi and pi_old share experts even after the weights moved.

Only the *selection* is replayed: the gate weights are recomputed from the trainer's fresh
router logits (softmax over all experts gathered at the replayed ids, renormalised as the model
does), so the router keeps its gradient. While ``record`` / ``replay`` is active each router
module's ``forward`` is patched on the instance (transformers 5 routers return
``(router_logits, weights [N, k], ids [N, k])``); every recorded entry must be consumed exactly
once, otherwise a layer was skipped or run twice and the replay would be silently wrong.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

import kernels

#: router class -> whether it casts the gate weights to the logits' dtype (as transformers does).
ROUTERS = {"Qwen3MoeTopKRouter": True, "MixtralTopKRouter": False}


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The MoE router modules in layer order (= ``Engine.moe_layers`` order)."""
    return [m for m in model.modules() if type(m).__name__ in ROUTERS]


def top_k(model: torch.nn.Module) -> int:
    found = routers(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no MoE router ({', '.join(ROUTERS)}); "
                         f"router replay only applies to MoE models")
    return int(found[0].top_k)


@contextlib.contextmanager
def record(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """R2 capture: yields a list that fills with each router's chosen ids [N, k] (int64) per
    call, in call order (one entry per MoE layer per forward)."""
    calls: list[torch.Tensor] = []

    def patched(router: torch.nn.Module, original):
        def forward(hidden_states: torch.Tensor):
            logits, weights, ids = original(hidden_states)
            calls.append(ids.detach().to(torch.long))
            return logits, weights, ids
        return forward

    with _patch(model, patched):
        yield calls


@contextlib.contextmanager
def replay(model: torch.nn.Module, ids_per_layer: list[torch.Tensor]) -> Iterator[None]:
    """Run the MoE layers on ``ids_per_layer[l]`` [N, k] (one forward, layers in order).

    Raises if a router is called more often than it has entries, or if an entry is left over
    when the block exits without an error."""
    layers = routers(model)
    if len(ids_per_layer) != len(layers):
        raise ValueError(f"router replay got ids for {len(ids_per_layer)} MoE layers but the model has "
                         f"{len(layers)}")
    consumed = [False] * len(layers)
    index = {id(r): i for i, r in enumerate(layers)}

    def patched(router: torch.nn.Module, original):
        layer, cast = index[id(router)], ROUTERS[type(router).__name__]
        renormalize = bool(getattr(router, "norm_topk_prob", True))

        def forward(hidden_states: torch.Tensor):
            if consumed[layer]:
                raise RuntimeError(f"router replay: MoE layer {layer} was called twice in one replayed "
                                   f"forward; replay one forward per `replay` block")
            consumed[layer] = True
            h = hidden_states.reshape(-1, router.hidden_dim)  # [N, H]
            ids = ids_per_layer[layer].to(h.device)
            if ids.shape != (h.shape[0], router.top_k):
                raise ValueError(f"router replay: layer {layer} has {h.shape[0]} tokens x top-{router.top_k} "
                                 f"but the replayed ids are {tuple(ids.shape)}")
            logits = F.linear(h, router.weight)  # [N, E]
            weights = kernels.replay_gate(logits, ids, renormalize=renormalize)  # [N, k] fp32
            return logits, (weights.to(logits.dtype) if cast else weights), ids
        return forward

    with _patch(model, patched):
        yield
        missing = [i for i, c in enumerate(consumed) if not c]
        if missing:
            raise RuntimeError(f"router replay: recorded routing of MoE layers {missing} was never "
                               f"consumed; the forward skipped them (the replay does not match the model)")


@contextlib.contextmanager
def _patch(model: torch.nn.Module, make) -> Iterator[None]:
    """Swap each router's ``forward`` for ``make(router, original_forward)`` on the instance."""
    layers = routers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no MoE router ({', '.join(ROUTERS)}); "
                         f"router replay only applies to MoE models")
    originals = [r.forward for r in layers]
    for r, orig in zip(layers, originals):
        r.forward = make(r, orig)
    try:
        yield
    finally:
        for r in layers:
            del r.forward  # back to the class's forward

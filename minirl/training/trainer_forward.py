"""The training engine's forward: token log-probs (and entropy) of a transformers causal LM.

Sequences are right-padded into one batch (causal attention: a real token never sees the
padding after it), or, with ``prompt_lens`` (``TrainConfig.shared_prefix``), packed as one row
per distinct prompt: the prompt once, then each of its completions attending to the prompt and
to itself only (a block mask and per-completion position ids). GRPO samples ``group_size``
completions of each prompt, so the padded batch repeats every prompt ``group_size`` times; the
packed one computes it once and scores each distinct (hidden state, target) pair once. The
lm_head + log-softmax runs through the fused chunked ``logprobs`` kernel (Triton on CUDA), so
peak memory does not scale with tokens x vocabulary.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

import kernels
from minirl.algorithms import router_replay
from minirl.families import logits_transform


@dataclass
class Forward:
    """Padded outputs of one forward over B sequences of max length L."""

    logp: torch.Tensor  # [B, L-1] float32; [b, t-1] = log p(token t | tokens < t), 0 on padding
    entropy: torch.Tensor  # [B, L-1] float32 entropy of the predictive distribution at t-1
    valid: torch.Tensor  # [B, L-1] bool, t < len(sequence b)
    routing: list[torch.Tensor] | None  # R2 record: per sequence [len, n_moe_layers, k] int64


def forward(model: torch.nn.Module, sequences: list[list[int]],
            routed_experts: list[torch.Tensor] | None = None, record_routing: bool = False,
            prompt_lens: list[int] | None = None) -> Forward:
    """Forward with autograd (the caller picks ``torch.no_grad`` for the old-logprob pass).

    ``routed_experts`` (R3, or R2 replay): per sequence [len, n_moe_layers, k] int64, the
    experts each MoE layer must use. ``record_routing``: return the experts chosen (R2).
    ``prompt_lens``: per sequence, how many leading tokens are its prompt; sequences with the
    same prompt then share one computation of it (same outputs up to float reduction order)."""
    _check_sequences(sequences)
    if prompt_lens is not None:
        if routed_experts is not None or record_routing:
            raise ValueError("prompt_lens (shared-prefix packing) with router replay/recording is not supported: "
                             "the routing records are per padded sequence; set shared_prefix: false")
        return _forward_shared_prefix(model, sequences, prompt_lens)
    lens = [len(s) for s in sequences]
    b, length = len(sequences), max(lens)
    device = next(model.parameters()).device
    ids = torch.zeros(b, length, dtype=torch.long)  # [B, L], right-padded with id 0
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    ids = ids.to(device)

    if routed_experts is not None and record_routing:
        raise ValueError("record_routing with routed_experts would record the replayed experts; pass one of them")
    if routed_experts is not None:
        ctx = router_replay.replay(model, _replay_ids(model, routed_experts, lens, length))
    else:
        ctx = router_replay.record(model) if record_routing else contextlib.nullcontext()
    with ctx as calls:  # calls: the recorded ids per MoE layer when recording
        hidden = model.base_model(input_ids=ids).last_hidden_state  # [B, L, H]

    valid = torch.arange(length - 1, device=device)[None, :] < (torch.tensor(lens, device=device)[:, None] - 1)
    targets = ids[:, 1:][valid]  # [N]
    lp, ent = head_logprobs(model, hidden[:, :-1][valid], targets)  # [N] each
    logp = torch.zeros(b, length - 1, dtype=torch.float32, device=device).masked_scatter(valid, lp.float())
    entropy = torch.zeros_like(logp).masked_scatter(valid, ent.detach().float())
    routing = None
    if record_routing:
        stacked = torch.stack(calls, dim=1).view(b, length, len(calls), -1)  # [B, L, n_moe, k]
        routing = [stacked[i, :n].cpu() for i, n in enumerate(lens)]
    return Forward(logp, entropy, valid, routing)


def forward_per_token(model: torch.nn.Module, sequences: list[list[int]], prompt_lens: list[int]) -> Forward:
    """``forward`` computed as an engine decoding with ``decode=recompute`` and ``batch_invariant`` computes
    it (``TrainConfig.trainer_forward: per_token``): each completion token from its own forward of the
    sequence's prefix, alone, the lm_head on that prefix's last row only, then ``log_softmax`` in fp32.

    Why: a batched forward's GEMMs have M = B x L rows where the engine's have M = prefix length and
    1 (the head), and the same product rounds differently by shape; the fused head takes
    ``z - logsumexp(z)`` where the engine takes ``log_softmax(z)``. With the shapes and the head the
    engine's, a bf16 trainer with eager attention scores the sampled tokens bit for bit as
    ``minirl:hf_exact,decode=recompute`` sampled them (docs/rl.md, on-policy bitwise). Costs one forward
    (and its backward) per completion token. Prompt positions are not scored (``valid`` false, 0)."""
    if len(prompt_lens) != len(sequences) or any(not 1 <= p < len(s) for p, s in zip(prompt_lens, sequences)):
        raise ValueError("per-token forward needs one prompt length per sequence, each in [1, len(sequence) - 1]")
    device = next(model.parameters()).device
    b, length = len(sequences), max(map(len, sequences))
    logp = torch.zeros(b, length - 1, dtype=torch.float32, device=device)  # [B, L-1]
    entropy = torch.zeros_like(logp)
    valid = torch.zeros(b, length - 1, dtype=torch.bool, device=device)
    for i, (s, p) in enumerate(zip(sequences, prompt_lens)):
        for t in range(p, len(s)):  # token t from the prefix s[:t]
            ids = torch.tensor([s[:t]], dtype=torch.long, device=device)  # [1, t]
            z = model(input_ids=ids, logits_to_keep=1).logits[0, -1].float()  # [V]
            lsm = z.log_softmax(-1)
            logp[i, t - 1] = lsm[s[t]]
            entropy[i, t - 1] = -(lsm.exp() * lsm).sum().detach()
            valid[i, t - 1] = True
    return Forward(logp, entropy, valid, None)


def head_logprobs(model: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob and entropy of ``targets`` [N] from final hidden states [N, H] through the fused
    ``logprobs`` kernel, with what the model's forward applies after ``lm_head`` (its family's
    ``minirl.families.logits_transform``: Granite's ``/ logits_scaling`` and Cohere's
    ``* logit_scale`` as a temperature, Gemma 2/3's soft-cap in the torch kernel, the Triton one
    having none), so these are ``log_softmax(model(ids).logits)``'s values, not ``lm_head``'s."""
    transform = logits_transform(getattr(model, "config", None))
    if transform.softcap is not None and transform.scale != 1.0:
        raise ValueError(f"{model.config.model_type}: logits scaled ({transform.scale}) and soft-capped "
                         f"({transform.softcap}) in one model; the fused logprobs kernel takes one of them")
    impl = "auto" if transform.softcap is None else "torch"
    weight = model.get_output_embeddings().weight  # [V, H]
    return kernels.get("logprobs", "chunked", impl)(hidden, weight, targets, temperature=1.0 / transform.scale,
                                                    softcap=transform.softcap)


def needs_forward(advantages: torch.Tensor, kl_coef: float) -> bool:
    """Whether a minibatch's update can move the weights, so its forward and backward are worth running.

    Every policy loss (PPO clip and dual-clip, GSPO, ESPO) is a clipped ratio times the advantage,
    so with every advantage exactly 0 (all groups rewarded alike) its value and gradient are exactly
    0 whatever the logprobs; the KL to the reference is the one term that stays. RL-ZVP reshaping
    (``zero_variance: reshape``) writes non-zero per-token advantages, so it is never skipped."""
    return kl_coef > 0 or bool(advantages.any())


def _forward_shared_prefix(model: torch.nn.Module, sequences: list[list[int]], prompt_lens: list[int]
                           ) -> Forward:
    """``forward`` with one packed row per distinct prompt (module docstring); same ``Forward``."""
    if len(prompt_lens) != len(sequences) or any(not 1 <= p <= len(s) for p, s in zip(prompt_lens, sequences)):
        raise ValueError("prompt_lens needs one entry per sequence, each in [1, len(sequence)]")
    device = next(model.parameters()).device
    rows: dict[tuple[int, ...], list[int]] = {}  # prompt -> its packed row's token ids
    place = []  # per sequence: (row, packed position of each of its tokens)
    spans: list[list[tuple[int, int, int]]] = []  # per row: (start, end, prompt length) of each completion
    for s, p in zip(sequences, prompt_lens):
        prompt = tuple(s[:p])
        if prompt not in rows:
            rows[prompt] = list(prompt)
            spans.append([])
        r = list(rows).index(prompt)
        toks = rows[prompt]
        start = len(toks)
        toks += s[p:]
        spans[r].append((start, len(toks), p))
        place.append((r, list(range(p)) + list(range(start, len(toks)))))
    n_rows, width = len(rows), max(len(t) for t in rows.values())
    ids = torch.zeros(n_rows, width, dtype=torch.long)
    pos = torch.zeros(n_rows, width, dtype=torch.long)
    mask = torch.eye(width, dtype=torch.bool).repeat(n_rows, 1, 1, 1)  # [R, 1, W, W]; padding sees itself
    for r, toks in enumerate(rows.values()):
        ids[r, : len(toks)] = torch.tensor(toks)
        p = spans[r][0][2]
        pos[r, :p] = torch.arange(p)
        mask[r, 0, :p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
        for start, end, _ in spans[r]:
            pos[r, start:end] = torch.arange(p, p + end - start)
            mask[r, 0, start:end, :p] = True
            mask[r, 0, start:end, start:end] = torch.ones(end - start, end - start, dtype=torch.bool).tril()
    dtype = next(model.parameters()).dtype  # additive, as eager attention adds it (sdpa takes it too)
    additive = torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)
    hidden = model.base_model(input_ids=ids.to(device), attention_mask=additive.to(device),
                              position_ids=pos.to(device)).last_hidden_state  # [R, W, H]
    # Prediction j of sequence b reads packed position place[b][j] and targets token j + 1;
    # identical (position, target) pairs (the shared prompt's own tokens) are scored once.
    at = torch.tensor([r * width + q for r, where in place for q in where[:-1]], dtype=torch.long)
    targets = torch.tensor([t for s in sequences for t in s[1:]], dtype=torch.long)
    vocab = model.get_output_embeddings().weight.shape[0]
    pairs, inverse = torch.unique(at * vocab + targets, return_inverse=True)
    flat = hidden.reshape(n_rows * width, -1)
    lp, ent = head_logprobs(model, flat[(pairs // vocab).to(device)], (pairs % vocab).to(device))  # [U] each
    inverse = inverse.to(device)
    lens = [len(s) for s in sequences]
    length = max(lens)
    valid = torch.arange(length - 1, device=device)[None, :] < (torch.tensor(lens, device=device)[:, None] - 1)
    logp = torch.zeros(len(sequences), length - 1, dtype=torch.float32, device=device).masked_scatter(
        valid, lp[inverse].float())
    entropy = torch.zeros_like(logp).masked_scatter(valid, ent[inverse].detach().float())
    return Forward(logp, entropy, valid, None)


def trainer_logprobs(model: torch.nn.Module, sequences: list[list[int]],
                     routed_experts: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """For each token list, float32 [len - 1] with entry ``t - 1`` = log p(token t | tokens < t)
    under the training engine. With ``routed_experts`` (one int64 [len, n_moe_layers, k] per
    sequence, ``torch.cat([rollout.prompt_routed_experts, rollout.routed_experts])``), the MoE
    layers use those experts (R3 router replay, CompassMax §2.4.4)."""
    with torch.no_grad():
        out = forward(model, sequences, routed_experts)
    return [out.logp[i, : len(s) - 1].cpu() for i, s in enumerate(sequences)]


def _replay_ids(model: torch.nn.Module, routed: list[torch.Tensor], lens: list[int], length: int
                ) -> list[torch.Tensor]:
    """Per-sequence [len, n_moe, k] -> per-layer [B * L, k] in the routers' row order
    (padding rows route to experts 0..k-1; their outputs are never read)."""
    n_moe, k = len(router_replay.routers(model)), router_replay.top_k(model)
    if len(routed) != len(lens):
        raise ValueError(f"routed_experts has {len(routed)} entries for {len(lens)} sequences; pass one each")
    padded = torch.arange(k).expand(len(lens), length, n_moe, k).clone()  # [B, L, n_moe, k]
    for i, (r, n) in enumerate(zip(routed, lens)):
        if tuple(r.shape) != (n, n_moe, k):
            raise ValueError(f"routed_experts[{i}] has shape {tuple(r.shape)}, expected ({n}, {n_moe}, {k}) = "
                             f"[len(sequence), n_moe_layers, top_k]; build it as torch.cat("
                             f"[rollout.prompt_routed_experts, rollout.routed_experts])")
        padded[i, :n] = r.long()
    return [padded[:, :, layer].reshape(-1, k) for layer in range(n_moe)]


def _check_sequences(sequences: list[list[int]]) -> None:
    if not isinstance(sequences, list) or not sequences:
        raise ValueError("sequences must be a non-empty list of token-id lists")
    short = [i for i, s in enumerate(sequences) if len(s) < 2]
    if short:
        raise ValueError(f"sequences {short[:5]} have fewer than 2 tokens: nothing to score")

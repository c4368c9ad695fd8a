"""``logprobs`` and ``entropy``: derived by the Tracker from ``logits``, identically for every engine.

Why derive instead of asking each engine: a comparison of two engines' logprobs must not
also compare two logprob *formulas*; here both sides go through the same float32
log-softmax. The logprob at row (request r, position p) is that of the next token of the
same request, the token at position p+1 (NaN when it is never seen, e.g. the last prompt
position of a plain forward or the last sampled token of a generate). During decode the
next token arrives one step later, so the row's log-softmax is kept until then: one
[vocab] row per request, never the full [tokens, vocab] table.
"""

from __future__ import annotations

import torch

Key = tuple[int, int]  # (request, position)


class NextTokenLogprobs:
    """Computes entropy at once and logprobs as soon as each next token is known."""

    def __init__(self) -> None:
        self._pending: dict[Key, tuple[int, torch.Tensor]] = {}  # (r, p+1) -> (row, logp[V])

    def on_logits(self, rows: torch.Tensor, keys: list[Key], logits: torch.Tensor,
                  token_of: dict[Key, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``logits`` [n, V] for capture ``rows`` [n] at ``keys`` -> (logprob [n], entropy [n]).

        ``token_of`` maps every (request, position) seen so far to its token id.
        """
        x = logits.detach().to(torch.float32)  # [n, V]
        lse = torch.logsumexp(x, dim=-1, keepdim=True)  # [n, 1]
        p = torch.exp(x - lse)  # [n, V]
        # One exp pass for both: H = lse - sum(p * x); log p(t) = x[t] - lse.
        entropy = (lse[:, 0] - (p * x).sum(-1))  # [n]
        targets = torch.tensor([token_of.get((r, p_ + 1), -1) for r, p_ in keys], dtype=torch.long)
        known = targets >= 0
        lp = torch.full((len(keys),), float("nan"))
        if bool(known.any()):
            idx = targets[known, None].to(x.device)
            lp[known] = (x[known].gather(1, idx) - lse[known])[:, 0].cpu()
        for i in torch.nonzero(~known)[:, 0].tolist():
            r, p_ = keys[i]
            self._pending[(r, p_ + 1)] = (int(rows[i]), (x[i] - lse[i]).clone())
        return lp, entropy.cpu()

    def on_token(self, key: Key, token_id: int) -> tuple[int, float] | None:
        """A newly seen token at ``key`` resolves the pending row before it: (row, logprob)."""
        hit = self._pending.pop(key, None)
        if hit is None or token_id < 0:
            return None
        row, logp = hit
        return row, float(logp[token_id])

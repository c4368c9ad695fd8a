"""``logprobs`` and ``entropy``: derived by the Tracker from ``logits``, identically for every engine.

Why derive instead of asking each engine: a comparison of two engines' logprobs must not
also compare two logprob *formulas*; here both sides go through the same float32
log-softmax. The logprob at row (request r, position p) is that of the next token of the
same request, the token at position p+1 (NaN when it is never seen, e.g. the last prompt
position of a plain forward or the last sampled token of a generate). During decode the
next token arrives one step later, so the row's log-softmax is kept until then: one
[vocab] row per request, never the full [tokens, vocab] table.

Why it is written out the way it is: these are the most expensive values the Tracker
computes (an ``exp`` over [tokens, vocab]), inside the engine's forward. One ``exp`` pass
serves both sites (the entropy reuses exp(x - max) instead of a second exp(x - lse) pass).
On the CPU the logits go through in row blocks of a few MiB with one reused scratch block,
so no [tokens, vocab] temporary is allocated (a fresh one page-faults on every forward);
every step is a torch call on whole rows (the sum of exponentials is ``torch.logsumexp``'s).
A logprob is (x[t] - max) - log(s), as a log-softmax computes it: x[t] - logsumexp would
cancel two terms of the size of the logits (an error of eps * |max|: 3.7e-3 at logits ~1e5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Key = tuple[int, int]  # (request, position)
_BLOCK = 1 << 20  # logits per row block on the CPU (a 4 MiB float32 scratch, reused)


@dataclass(frozen=True)
class DeviceLogits:
    """The derived sites of one device forward's logits, computed there and read nowhere yet
    (``aligntools.tracker.pending``): the host picks them up after the forward's one sync."""

    x: torch.Tensor  # [N, V] the engine's logits, kept for rows whose next token comes later
    top: torch.Tensor  # [N, 1] float32
    log_s: torch.Tensor  # [N, 1] float32
    targets: torch.Tensor  # [N] int64: the next token within this forward, -1 where none
    logprob: torch.Tensor | None  # [N] float32 at ``targets`` (meaningless where -1)
    entropy: torch.Tensor | None  # [N] float32

    def numbers(self) -> list[torch.Tensor]:
        """The small tensors the host needs: brought over in the forward's one copy."""
        return [t for t in (self.targets, self.logprob, self.entropy) if t is not None]


class NextTokenLogprobs:
    """Computes entropy at once and logprobs as soon as each next token is known, each only
    when asked for: the entropy costs an extra multiply-and-sum pass over the logits."""

    def __init__(self, logprobs: bool = True, entropy: bool = True) -> None:
        self.logprobs, self.entropy = logprobs, entropy
        self._pending: dict[Key, tuple[int, torch.Tensor]] = {}  # (r, p+1) -> (row, logp[V])

    def on_logits(self, rows: torch.Tensor, keys: list[Key], logits: torch.Tensor,
                  token_of: dict[Key, int]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``logits`` [n, V] for capture ``rows`` [n] at ``keys`` -> (logprob [n], entropy [n]),
        None for the one not asked for.

        ``token_of`` maps every (request, position) seen so far to its token id.
        """
        x = logits.detach()  # [n, V], the engine's dtype
        top, log_s, entropy = _log_partition(x, self.entropy)  # [n, 1], [n, 1], [n] or None
        return (self._logprobs(rows, keys, x, top, log_s, token_of) if self.logprobs else None), entropy

    def on_device_logits(self, logits: torch.Tensor, targets: torch.Tensor) -> DeviceLogits:
        """``logits`` [N, V] of a device forward with each row's next token ``targets`` [N]
        (-1 unknown) -> the derived sites as device tensors, nothing read on the host."""
        x = logits.detach()
        top, log_s, entropy = _log_partition(x, self.entropy, sync_free=True)
        logprob = None
        if self.logprobs:  # clamped: an id past the vocab is refused on the host (resolve_device)
            t = targets.clamp(0, x.shape[1] - 1)[:, None]  # [N, 1]
            logprob = ((x.gather(1, t).float() - top) - log_s)[:, 0]
        return DeviceLogits(x, top, log_s, targets, logprob, entropy)

    def resolve_device(self, held: DeviceLogits, numbers: dict[int, torch.Tensor], kept: torch.Tensor | None,
                       rows: torch.Tensor, keys: list[Key], token_of: dict[Key, int]
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``on_logits``' answer for the ``kept`` rows (None: all) of ``held``, from the host
        copies in ``numbers`` (id of a device tensor -> its host copy). The device took each
        row's successor within the forward; a row whose next token the host knows otherwise,
        or not yet (kept pending, as ``on_logits`` does), is read from ``held.x`` here, after
        the forward's sync."""
        idx = torch.arange(len(held.x)) if kept is None else kept  # [n] rows of held.x
        entropy = numbers[id(held.entropy)][idx] if self.entropy else None
        if not self.logprobs:
            return None, entropy
        nxt = [token_of.get((r, p_ + 1), -1) for r, p_ in keys]
        _check_width(max(nxt, default=-1), held.x.shape[1])
        out = numbers[id(held.logprob)][idx].clone()  # [n]
        for j, (want, got) in enumerate(zip(nxt, numbers[id(held.targets)][idx].tolist())):
            if want == got >= 0:
                continue
            i = int(idx[j])
            logp = (held.x[i].float() - held.top[i]) - held.log_s[i]  # [V]
            if want >= 0:
                out[j] = float(logp[want])
            else:
                out[j] = float("nan")
                r, p_ = keys[j]
                self._pending[(r, p_ + 1)] = (int(rows[j]), logp)
        return out, entropy

    def _logprobs(self, rows: torch.Tensor, keys: list[Key], x: torch.Tensor, top: torch.Tensor,
                  log_s: torch.Tensor, token_of: dict[Key, int]) -> torch.Tensor:
        """log p(next token) = (x[t] - top) - log_s [n] of logits ``x`` [n, V], NaN where the
        next token is not known yet (its row's log-softmax is kept until it is)."""
        nxt = [token_of.get((r, p_ + 1), -1) for r, p_ in keys]
        _check_width(max(nxt, default=-1), x.shape[1])
        targets = torch.tensor(nxt, dtype=torch.long)  # [n]
        known = targets >= 0
        picked = (x.gather(1, targets.clamp(min=0)[:, None].to(x.device)).float() - top) - log_s  # [n, 1]
        for i in torch.nonzero(~known)[:, 0].tolist():
            r, p_ = keys[i]
            self._pending[(r, p_ + 1)] = (int(rows[i]), (x[i].float() - top[i]) - log_s[i])
        return torch.where(known, picked[:, 0].cpu(), float("nan"))

    def on_token(self, key: Key, token_id: int) -> tuple[int, float] | None:
        """A newly seen token at ``key`` resolves the pending row before it: (row, logprob)."""
        hit = self._pending.pop(key, None)
        if hit is None or token_id < 0:
            return None
        row, logp = hit
        _check_width(token_id, len(logp))
        return row, float(logp[token_id])


def _check_width(token_id: int, width: int) -> None:
    """A next token must be one of the logits' columns; else these are not next-token logits
    over the ids' vocabulary (a raw module's output, say), and a logprob means nothing."""
    if token_id >= width:
        raise ValueError(f"logprobs: next-token id {token_id} is outside the {width} logits of its row, so the "
                         f"model's output is not next-token logits over these ids; capture without the derived "
                         f"sites (sites='embed,L*,final_norm,logits', or the module paths you need) or give ids "
                         f"below {width}")


def _log_partition(logits: torch.Tensor, entropy: bool, sync_free: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(max [n, 1], log(s) [n, 1], entropy [n] on the CPU or None) of ``logits`` [n, V] in
    float32, a row block at a time; log p = (x - max) - log(s). ``sync_free``: nothing is
    read on the host and the entropy stays on the logits' device (a device forward).

    One ``exp`` pass serves all: with d = x - max, e = exp(d) and s = sum(e),
    log p = d - log(s) and H = log(s) - sum(e * d) / s (p = e / s). The ``exp`` is most of
    the cost, and the textbook second pass, p = exp(x - lse), only re-derives e / s. Summing
    the shifted d instead of x also keeps the entropy accurate for peaked rows: with
    sum(p * x) both terms are ~max and cancel, an error of eps * max instead of eps * H
    (measured: 5e-3 vs 1.1e-7 on [64, 8192] N(0, 100^2) logits, against float64).
    """
    blocks = _row_blocks(logits)
    scratch = logits.new_empty((2, max(map(len, blocks)), logits.shape[1]), dtype=torch.float32)  # reused
    tops, logs, ents = [], [], []
    for block in blocks:
        x = block.to(torch.float32)  # [b, V]
        d, e = scratch[:, :len(x)]  # [b, V] each
        total, top = _sum_exp(x, d, e)  # [b, 1] each
        log_s = total.log()  # [b, 1]
        if entropy and sync_free:  # masked (-inf) logits add 0 (0 log 0 = 0): no row to look for
            ents.append(log_s[:, 0] - torch.where(e > 0, e * d, 0.0).sum(-1).div_(total[:, 0]))
        elif entropy:
            ents.append(_fix_masked(log_s[:, 0] - e.mul_(d).sum(-1).div_(total[:, 0]), x, top, log_s))
        tops.append(top)
        logs.append(log_s)
    if not entropy:
        return torch.cat(tops), torch.cat(logs), None
    ent = torch.cat(ents)
    return torch.cat(tops), torch.cat(logs), ent if sync_free else ent.cpu()


def _fix_masked(ent: torch.Tensor, x: torch.Tensor, top: torch.Tensor, log_s: torch.Tensor) -> torch.Tensor:
    """``ent`` [b] with its rows that hold masked (-inf) logits recomputed: there e * d is
    0 * -inf = NaN, while a masked token has p = 0 and adds nothing (0 log 0 = 0). A row
    with a NaN logit or no finite one stays NaN (``log_s`` [b, 1] is NaN / -inf there)."""
    redo = torch.nonzero(ent.isnan() & log_s[:, 0].isfinite())[:, 0]
    if len(redo):
        d = x[redo] - top[redo]  # [k, V]
        e = d.exp()
        ent[redo] = log_s[redo, 0] - torch.where(e > 0, e * d, 0.0).sum(-1) / e.sum(-1)
    return ent


def _row_blocks(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``x`` [n, V] as views of about ``_BLOCK`` values each on the CPU, whole elsewhere.

    Never a lone row out of several: torch sums a lone row of 32768+ values in two parallel
    halves, a different order than the same row among others (other devices pick their
    reduction order from the shape, hence one block there).
    """
    n = len(x)
    per = max(2, _BLOCK // max(x.shape[1], 1)) if x.is_cpu else n
    if per >= n:
        return (x,)
    sizes = [per] * (n // per) + ([n % per] if n % per else [])
    if sizes[-1] == 1:
        sizes[-2:] = [per + 1]
    return x.split(sizes)


def _sum_exp(x: torch.Tensor, d: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum(exp(x - top)) [b, 1], top [b, 1]) of ``x`` [b, V], writing x - top into ``d``
    and exp(x - top) into ``e``.

    ``log(sum) + top`` is ``torch.logsumexp(x, -1, keepdim=True)`` bit for bit (the same
    calls in the same order as torch's own, tested), written out so that its [b, V]
    temporaries are the caller's reused blocks and stay readable for the entropy.
    """
    top = x.amax(-1, keepdim=True)  # [b, 1]
    top.masked_fill_(top.abs() == float("inf"), 0)
    torch.sub(x, top, out=d)
    return torch.exp(d, out=e).sum(-1, keepdim=True), top

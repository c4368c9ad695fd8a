"""The host side of ``Engine.generate``: which rollouts are live, where each one's next token
goes, when one ends, and when the KV cache is compacted (nano-vllm's schedule step).

Why a class of its own: these decisions are Python ints and small CPU tensors, the same on
every device, while the runner (``engine.runner``) owns everything that touches the model.
The one device value the scheduler reads is the per-step stop flag, and only when a stop id
exists; a row that can only end by length is retired from the budget, without a read. It keeps
two tensors on the device, the stop ids and the prompt lengths, so that a step's stop flags
and positions are computed there without a copy from the host.
"""

from __future__ import annotations

import torch

from minirl.engine.config import ModelSpec
from minirl.engine.sampling import SamplingParams


class Scheduler:
    """Live rows of one ``generate`` call. Rollout ``r`` is ``rows[r]``'s continuation; the live
    batch is ``alive`` (rollout ids, in KV-cache row order: live row ``b`` is cache row ``b``)."""

    def __init__(self, rows: list[list[int]], params: SamplingParams, spec: ModelSpec,
                 device: torch.device) -> None:
        self.rows = rows
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(spec.eos_token_ids))
        self.stop_ids = torch.tensor(sorted(stops), dtype=torch.long, device=device)  # [S]
        self.plens = torch.tensor([len(p) for p in rows])  # [R]
        self.device_plens = self.plens.to(device)  # [R]
        self.budget = (spec.max_positions - self.plens).clamp(max=params.max_new_tokens)  # [R] new tokens allowed
        self.t_max = int(self.budget.max())
        self.capacity = int((self.plens + self.budget).max())  # KV-cache positions a row can need
        self.n_gen = self.budget.clone()  # rows that end by length; a row that stops gets its count then
        self.finish_stop = torch.zeros(len(rows), dtype=torch.bool)
        self.alive = torch.arange(len(rows))  # [B] rollout id of each live row
        self.t = 0  # decode steps done: the next sampled token is token ``t`` of every live row
        self.first_end = int(self.budget.min())  # steps after which the first row ends by length

    @property
    def running(self) -> bool:
        return bool(self.alive.numel())

    def span(self, group: slice) -> tuple[int, int]:
        """(min, max) position of the tokens the live rows ``group`` feed this step, from the
        host's copy, so planning a step reads no device tensor."""
        pos = self.plens[self.alive[group]] + self.t
        return int(pos.min()), int(pos.max())

    def positions(self, alive: torch.Tensor) -> torch.Tensor:
        """[B] positions of the tokens the rollouts ``alive`` [B] (on the device) feed this step."""
        return self.device_plens[alive] + self.t

    def stopped(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """[B] bool on the tokens' device: which just-sampled tokens are stop ids (None: no stop ids)."""
        return (tokens[:, None] == self.stop_ids).any(-1) if self.stop_ids.numel() else None

    def advance(self, stopped: torch.Tensor | None) -> torch.Tensor | None:
        """Close step ``t`` (its tokens were sampled and fed): retire the rows that stopped or
        used their budget -> the live rows to keep, in order ([b'] int64 on the host), when some
        ended (the caller compacts logits and KV cache to them), else None."""
        self.t += 1
        if stopped is None and self.t < self.first_end:  # no row can have ended: no tensor reads
            return None
        alive = self.alive
        done = self.budget[alive] <= self.t  # [B]
        if stopped is not None:
            stopped = stopped.cpu()
            self.finish_stop[alive] = stopped
            self.n_gen[alive[stopped]] = self.t
            done |= stopped
        if not bool(done.any()):
            return None
        keep = (~done).nonzero()[:, 0]
        self.alive = alive[keep]
        if keep.numel():
            self.first_end = int(self.budget[self.alive].min())
        return keep

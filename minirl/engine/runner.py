"""The device side of the engine (nano-vllm's run step): prefill, one decode step, scoring,
and the KV cache they write, all on the model's device.

A decode step replays a CUDA graph (``engine.graphs``) when it can, and runs eagerly when a
graph would compute something else or nothing faster: on CPU, with ``cuda_graphs=False``,
with taps attached (a replay calls no Python), with ``decode="recompute"`` (no KV cache; the
prefix grows every step), with ``batch_invariant`` (each row runs alone at its own cache row)
and for a step with more live rows than the largest bucket. ``eager_reason`` says which.
"""

from __future__ import annotations

import logging

import torch

from minirl.engine.batch import ForwardBatch
from minirl.engine.graphs import BUCKETS, DecodeGraphs, bucket, cache_rows
from minirl.engine.knobs import Knobs
from minirl.engine.kv_cache import KVCache
from minirl.engine.model import Transformer
from minirl.engine.ops import resolve_dtype
from minirl.engine.scheduler import Scheduler
from minirl.engine.tap import Tap

log = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, model: Transformer, knobs: Knobs, taps: list[Tap], cuda_graphs: bool) -> None:
        self.model, self.knobs, self.taps, self.cuda_graphs = model, knobs, taps, cuda_graphs
        self.graphs: DecodeGraphs | None = None
        self.capture_error: str | None = None  # why capture failed once (then decode stays eager)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def eager_reason(self) -> str | None:
        """Why decode steps run eagerly, or None when they replay CUDA graphs."""
        if self.device.type != "cuda":
            return f"device {self.device.type}: CUDA graphs need a CUDA device"
        if not self.cuda_graphs:
            return "cuda_graphs=False"
        if self.knobs.decode == "recompute":
            return "decode='recompute' keeps no KV cache: the prefix, and so every shape, grows each step"
        if self.knobs.batch_invariant:
            return "batch_invariant runs each row alone at its own cache row"
        if self.taps:
            return "taps are attached: a replayed graph calls no Python"
        if self.capture_error is not None:
            return f"CUDA graph capture failed: {self.capture_error}"
        return None

    def groups(self, n: int) -> list[slice]:
        """Batches of rows computed together: all at once, or one by one when batch-invariant."""
        return [slice(i, i + 1) for i in range(n)] if self.knobs.batch_invariant else [slice(0, n)]

    def new_cache(self, rows: int, capacity: int) -> KVCache | None:
        """The KV cache of a generate call of ``rows`` rollouts of up to ``capacity`` tokens (None
        for ``decode="recompute"``). Under CUDA graphs it is the graphs' persistent cache, zeroed,
        with every bucket the call can reach captured (before the prefill writes to it)."""
        if self.knobs.decode == "recompute":
            return None
        dtype = resolve_dtype(self.knobs.kv_cache_dtype, self.model.dtype)
        reason = self.eager_reason()
        if reason is not None:
            log.debug("minirl decode runs eagerly: %s", reason)
            return self.model.new_cache(rows, capacity, dtype)
        if self.graphs is None or not self.graphs.fits(cache_rows(rows), capacity, dtype):
            self.graphs = None  # its memory first
            self.graphs = DecodeGraphs(self.model, self.model.new_cache(cache_rows(rows), capacity, dtype))
        top = bucket(min(rows, BUCKETS[-1]))
        try:
            self.graphs.capture([b for b in BUCKETS if b <= top])
        except RuntimeError as e:  # a kernel that reads back to the host or allocates: eager, loudly
            self.graphs, self.capture_error = None, f"{type(e).__name__}: {str(e).splitlines()[0]}"
            log.warning("minirl decode runs eagerly: CUDA graph capture failed (%s)", self.capture_error)
            return self.model.new_cache(rows, capacity, dtype)
        return self.graphs.cache

    @torch.no_grad()
    def score(self, seqs: list[list[int]]) -> list[torch.Tensor]:
        """Raw logprobs of tokens 1.. of each sequence (float32 [len - 1], on the host)."""
        out: list[torch.Tensor] = []
        for group in self.groups(len(seqs)):
            part = seqs[group]
            batch = ForwardBatch.prefill(part, list(range(group.start, group.stop)), cache_start=None,
                                         device=self.device)
            logits, _ = self.model.forward(batch, None, self.taps)  # [N, V]
            nxt = torch.tensor([t for s in part for t in s[1:] + s[:1]], device=self.device)  # [N] next token
            lp = logits.float().log_softmax(-1).gather(1, nxt[:, None])[:, 0].cpu()  # [N]
            out += [row[:-1] for row in lp.split(batch.seq_lens)]
        return out

    def prefill(self, rows: list[list[int]], requests: list[int], cache: KVCache | None
                ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Prefill ``rows`` (taps' request ids ``requests``) into cache rows 0..len(rows)-1 ->
        (last-position logits [len(rows), V] on the device, per-row prompt routing
        [P, n_moe, k] on the host, or None)."""
        logits, routing = [], []
        for group in self.groups(len(rows)):
            batch = ForwardBatch.prefill(rows[group], requests[group], cache_start=group.start, device=self.device)
            lg, rt = self.model.forward(batch, cache, self.taps, logits_rows=batch.last_rows)
            logits.append(lg)
            if rt is not None:
                routing += list(rt.cpu().split(batch.seq_lens))
        return _cat(logits), (routing or None)

    def decode(self, sched: Scheduler, alive: torch.Tensor, tokens: torch.Tensor, cache: KVCache | None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decode step ``t + 1``: feed token ``t`` of every live row -> (next-token logits [B, V],
        routing of the fed tokens [B, n_moe, k] or None), on the device. ``alive`` [B] is
        ``sched.alive`` on the device, ``tokens`` [R, T_max] the sampled tokens so far."""
        t = sched.t
        if self.graphs is not None and cache is self.graphs.cache and alive.numel() <= BUCKETS[-1]:
            return self.graphs.run(tokens[alive, t], sched.positions(alive))
        logits, routing = [], []
        for group in self.groups(alive.numel()):
            ids = alive[group]  # rollout ids
            if cache is None:  # decode="recompute": the whole prefix again, as the trainer does
                host = sched.alive[group].tolist()
                seqs = [sched.rows[r] + tokens[r, : t + 1].tolist() for r in host]
                batch = ForwardBatch.prefill(seqs, host, cache_start=None, device=self.device, step=t + 1,
                                             emit_last_only=True)
                lg, rt = self.model.forward(batch, None, self.taps, logits_rows=batch.last_rows)
            else:
                batch = ForwardBatch.decode_step(tokens[ids, t], sched.positions(ids), ids, group, t + 1,
                                                 span=sched.span(group))
                lg, rt = self.model.forward(batch, cache, self.taps)
            logits.append(lg)
            if rt is not None:
                routing.append(rt)
        return _cat(logits), (_cat(routing) if routing else None)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat`` that does not copy the single part of an unsplit batch (every decode step)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)

"""CUDA-graph decode: one captured decode step per batch bucket, replayed every step.

Why: a decode step of a small model is hundreds of tiny kernels, so on a GPU the host's launch
time, not the GPU, sets the speed; replaying a captured graph launches them all at once.
A graph fixes every shape and address, so the captured step is the *static* decode
(``ForwardBatch.static_decode``): the live rows padded up to a bucket of
``BUCKETS``, the whole KV cache read under a mask, MoE padded for the worst routing, and
the inputs copied into buffers the graph reads. Padding rows feed token 0 at position 0 into
cache rows no live sequence owns. ``StaticDecode`` is that step without the graph, so the CPU
tests run the same code the GPU replays.
"""

from __future__ import annotations

import torch

import kernels
from minirl.engine.batch import ForwardBatch
from minirl.engine.kv_cache import KVCache
from minirl.engine.model import Transformer

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def bucket(n: int) -> int | None:
    """The smallest bucket that holds ``n`` live rows; None above the largest (that step runs
    eagerly: a graph per larger size would cost more memory than its launches save)."""
    return next((b for b in BUCKETS if b >= n), None)


def cache_rows(n: int) -> int:
    """KV-cache rows a graph-decoded generate of ``n`` rollouts needs: its bucket's padding
    rows write into the cache too."""
    return max(n, bucket(min(n, BUCKETS[-1])) or 0)


class StaticDecode:
    """The decode step over cache rows ``0..bucket-1`` with shapes fixed by the bucket, reading
    its inputs from buffers (what a graph captures; eager on CPU)."""

    def __init__(self, model: Transformer, cache: KVCache) -> None:
        self.model, self.cache = model, cache
        device = cache.k[0].device
        self.tokens = torch.zeros(cache.rows, dtype=torch.long, device=device)  # [rows]
        self.positions = torch.zeros(cache.rows, dtype=torch.long, device=device)  # [rows]
        self.slots = torch.arange(cache.rows, device=device)  # [rows] taps' request ids (no taps run here)

    def stage(self, tokens: torch.Tensor, positions: torch.Tensor) -> int:
        """Copy the live rows' ``tokens``/``positions`` [B] (device) into the buffers, zero the
        padding up to their bucket -> that bucket."""
        b = tokens.shape[0]
        bp = bucket(b)
        assert bp is not None, f"{b} rows exceed the largest bucket {BUCKETS[-1]}"
        self.tokens[:b].copy_(tokens)
        self.positions[:b].copy_(positions)
        self.tokens[b:bp].zero_()
        self.positions[b:bp].zero_()
        return bp

    def forward(self, bp: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The step for bucket ``bp`` on the staged inputs -> (logits [bp, V], routing
        [bp, n_moe, k] or None)."""
        batch = ForwardBatch.static_decode(self.tokens[:bp], self.positions[:bp], self.slots[:bp],
                                           self.cache.capacity, step=0)
        return self.model.forward(batch, self.cache, [])

    def run(self, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Eager static step for the live rows: (logits [B, V], routing [B, n_moe, k] or None)."""
        logits, routing = self.forward(self.stage(tokens, positions))
        b = tokens.shape[0]
        return logits[:b], None if routing is None else routing[:b]


class DecodeGraphs:
    """Captured ``StaticDecode`` steps, one per bucket, over one KV cache that outlives the
    generate calls (the graphs hold its addresses; ``Engine.load_weights`` copies in place, so
    they hold the weights' too)."""

    def __init__(self, model: Transformer, cache: KVCache) -> None:
        self.static = StaticDecode(model, cache)
        self.cache = cache
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor | None]] = {}
        self.pool = None  # the memory pool every graph shares (captured largest first)

    def fits(self, rows: int, capacity: int, dtype: torch.dtype) -> bool:
        return self.cache.rows >= rows and self.cache.capacity >= capacity and self.cache.dtype == dtype

    @torch.inference_mode()
    def capture(self, buckets: list[int]) -> None:
        """Capture the missing ``buckets``, then zero the cache their warm-up runs wrote to.
        Called before the prefill: warm-up steps really run, and must not overwrite live rows."""
        with kernels.trusted():
            for bp in sorted(set(buckets) - set(self.graphs), reverse=True):
                self.static.tokens.zero_()
                self.static.positions.zero_()
                side = torch.cuda.Stream()  # warm-up off the capture stream: lazy init (cuBLAS, autotune)
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    self.static.forward(bp)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    logits, routing = self.static.forward(bp)
                self.pool = graph.pool() if self.pool is None else self.pool
                self.graphs[bp] = (graph, logits, routing)
        self.cache.reset()

    def run(self, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Replay the live rows' bucket: (logits [B, V], routing [B, n_moe, k] or None), views
        into the graph's outputs, valid until the next replay."""
        graph, logits, routing = self.graphs[self.static.stage(tokens, positions)]
        graph.replay()
        b = tokens.shape[0]
        return logits[:b], None if routing is None else routing[:b]

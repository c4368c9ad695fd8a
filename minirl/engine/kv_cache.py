"""Preallocated KV cache: one [rows, n_kv, capacity, head_dim] tensor per layer for K and V.

Why preallocated and row-compacted: a decode step must not allocate or concatenate (what
makes HF's DynamicCache slow), and reading rows ``0..B-1`` is a view, not a gather. When
sequences finish, ``keep`` moves the survivors to the front once, instead of gathering
the live rows in every layer of every step.

The cache lives on the engine's device; under CUDA graphs one cache outlives the generate
calls (``reset`` zeroes it), because a captured graph holds its buffers' addresses.

The cache dtype is a knob (Ring-linear 5.2.1 "KV Cache"): values are rounded to it on
write and widened back to the activation dtype on read.
"""

from __future__ import annotations

import torch

from minirl.engine.batch import ForwardBatch


class KVCache:
    def __init__(self, n_layers: int, rows: int, capacity: int, n_kv: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, v_head_dim: int | None = None) -> None:
        shape = (rows, n_kv, capacity, head_dim)
        v_shape = shape if v_head_dim is None else (rows, n_kv, capacity, v_head_dim)  # MLA: V != K dim
        # zeros, not empty: a shorter row's masked tail is still read, and 0 * NaN would be NaN
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(v_shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.dtype, self.rows, self.capacity = dtype, rows, capacity

    def buffers(self) -> list[torch.Tensor]:
        """Every tensor of the cache (subclasses add their per-row state)."""
        return [*self.k, *self.v]

    def reset(self) -> None:
        """Zero every buffer in place, for the next generate call (the addresses stay)."""
        for t in self.buffers():
            t.zero_()

    def write(self, layer: int, batch: ForwardBatch, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the batch's ``k``/``v`` [N, n_kv, head_dim] at each token's (row, position)."""
        k, v = k.to(self.dtype), v.to(self.dtype)
        pos = batch.uniform_position
        if pos is not None:  # decode step where every row is at the same position: a slice copy
            self.k[layer][batch.cache_rows, :, pos] = k
            self.v[layer][batch.cache_rows, :, pos] = v
            return
        self.k[layer][batch.cache_index, :, batch.positions] = k
        self.v[layer][batch.cache_index, :, batch.positions] = v

    def read(self, layer: int, rows: slice, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of ``rows`` for positions ``< length``: [B, n_kv, length, head_dim] in ``dtype``."""
        k = self.k[layer][rows, :, :length]
        v = self.v[layer][rows, :, :length]
        return k.to(dtype), v.to(dtype)

    def keep(self, rows: torch.Tensor) -> None:
        """Move ``rows`` (in this order) to the front; the rest becomes free."""
        n = rows.shape[0]
        for t in self.buffers():
            t[:n] = t[rows]

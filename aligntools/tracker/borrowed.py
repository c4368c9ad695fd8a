"""Tensor mode without copies: a captured value kept by reference, checked before it is read.

Why: copying every site in the hook is most of tensor mode's cost (at hidden 512, ~52 MB
per forward of 2 x 256 tokens); nnsight keeps references instead. A reference is only
safe while nobody writes the engine's tensor after the hook, so a ``Borrowed`` value
remembers the tensor's version counter and data pointer at capture time (torch bumps the
counter on every in-place write, through any view of the storage) and ``take`` refuses to
read a tensor that changed: ``CapturedValueModified`` names the site and the fix
(``copy=True``) instead of storing values the engine never produced at that site.

What is borrowed (``can_borrow``): CPU tensors of engines whose writes go through torch
ops (models made only of transformers' and torch's modules; the adapter says so), that
track versions (not inference-mode tensors) and whose storage is not much larger than the value (a view into a big buffer
would keep all of it alive). Anything else is copied in the hook as before.

Once read, a borrowed value may become the capture's own array (a float32 tensor is
stored without a copy). ``take(exclusive=True)`` copies it unless the capture is the only
owner of its storage left, so no later write by the engine or the caller can reach the
capture's values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_use_count = getattr(torch._C, "_storage_Use_Count", None)  # private; without it exclusive reads copy


class CapturedValueModified(RuntimeError):
    """A tensor kept by reference in tensor mode was written in place after its hook."""


@dataclass(frozen=True)
class Borrowed:
    """The engine's tensor ``value`` [n, ...] as captured at ``site``."""

    site: str
    value: torch.Tensor
    version: int
    data_ptr: int

    @classmethod
    def of(cls, site: str, value: torch.Tensor) -> "Borrowed":
        ref = value.detach()  # a view of its own: no base chain shared with the engine's tensors
        return cls(site, ref, ref._version, ref.data_ptr())

    def __len__(self) -> int:
        return len(self.value)

    def take(self, exclusive: bool = False) -> torch.Tensor:
        """The captured values; a copy where ``exclusive`` and someone else still holds them."""
        v = self.value
        if v._version != self.version or v.data_ptr() != self.data_ptr:
            raise CapturedValueModified(
                f"{self.site}: the captured tensor was written in place after its hook (version "
                f"{self.version} -> {v._version}; by the engine, a hook or code inside the `with` block), so "
                f"tensor mode's reference no longer holds the captured values; capture with copies instead: "
                f"Tracker(..., copy=True) or capture(..., copy=True)")
        if exclusive and not _sole_owner(v):
            return v.clone()
        return v


def can_borrow(value: torch.Tensor) -> bool:
    """Whether ``value`` can be kept by reference (see the module docstring)."""
    return (value.device.type == "cpu" and not value.is_inference()
            and value.untyped_storage().nbytes() <= 2 * value.numel() * value.element_size())


def _sole_owner(value: torch.Tensor) -> bool:
    """True when no tensor but ``value`` uses its storage (the count includes the temporary
    storage object made to ask)."""
    return _use_count is not None and value._base is None and _use_count(value.untyped_storage()._cdata) <= 2

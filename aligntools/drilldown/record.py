"""Record every tensor op one module runs, with the dataflow between them.

Why a dispatch mode: it sees the aten ops a forward really runs, whatever Python wrote them
(``nn.Linear``, ``F.linear``, ``torch.matmul``) and in both engines alike. Only ops fed by the
module's input (the *activation*) are kept as compute ops; weights, tables and masks built
outside are part of the op that reads them, as a site's weights are part of the site.

Views, copies, gathers and dtype casts do not compute: they pass their input's sources on,
so an op's inputs are the compute ops (or the module input, source -1) its arguments come
from. A cast is the consuming op's precision (``softmax`` on a bf16 copy is a bf16 softmax),
so an argument reached through a cast is compared *before* the cast.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from aligntools.drilldown.roles import family, role_of_stack

MODULE_INPUT = -1
PASS_THROUGH = {"clone", "copy_", "contiguous", "_to_copy", "index", "index_select", "gather", "cat", "stack",
                "repeat", "repeat_interleave", "lift_fresh", "detach", "alias", "new_zeros", "zeros_like",
                "index_put", "index_put_", "_unsafe_view", "_reshape_alias", "constant_pad_nd", "where",
                "new_empty", "empty_like", "ones_like", "full_like"}
"""Ops that move, cast or allocate values without computing new ones (views: ``is_view``)."""


@dataclass
class Arg:
    """An activation argument: ``value`` as the op read it and, when a cast made it, the value
    ``before`` the cast (the cast being the op's own precision)."""

    value: torch.Tensor
    before: torch.Tensor | None = None

    @property
    def uncast(self) -> torch.Tensor:
        return self.value if self.before is None else self.before

    def compared_with(self, other: Arg) -> tuple[torch.Tensor, torch.Tensor]:
        """The pair to compare: before any cast where both shapes agree, else as read."""
        a, b = self.uncast, other.uncast
        return (a, b) if a.shape == b.shape else (self.value, other.value)


@dataclass
class Op:
    """One compute op fed by the activation. ``out``: its first floating output in the token-major
    layout (``token_major``); ``args``: per activation argument, what the other side's is compared with;
    ``arg_sources``: per activation argument, the compute ops (or ``MODULE_INPUT``) it comes from;
    ``seq``: the sequence length (``key``)."""

    index: int
    name: str
    family: str
    role: str
    in_dtypes: tuple[str, ...]
    out_dtype: str
    out: torch.Tensor
    args: tuple[Arg, ...]
    arg_sources: tuple[tuple[int, ...], ...]
    seq: int

    @property
    def key(self) -> tuple:
        """What pairs an op with the other engine's: role, family and token-major output shape.
        Rows per (token, expert slot) - a multiple of the tokens - are in an order each engine
        picks (grouped by expert, sorted, padded): such an op pairs with nothing."""
        rows = self.out.shape[0] if self.out.dim() else 0
        if self.seq and rows > self.seq and rows % self.seq == 0:
            return "token-slot rows", id(self)
        return self.role, self.family, tuple(self.out.shape)

    @property
    def dtype(self) -> str:
        """``float32``, or ``bfloat16->float32`` where the op reads one dtype and writes another."""
        ins = "/".join(dict.fromkeys(self.in_dtypes)) or self.out_dtype
        return ins if ins == self.out_dtype else f"{ins}->{self.out_dtype}"


def token_major(t: torch.Tensor, seq: int) -> torch.Tensor:
    """transformers' ``[1, S, ...]`` and ``[1, heads, S, ...]`` as minirl's flat ``[S, ...]`` /
    ``[S, heads, ...]``, so one sequence's values line up element by element."""
    if t.dim() >= 2 and t.shape[0] == 1 and t.shape[1] == seq:
        return t[0]
    if t.dim() >= 3 and t.shape[0] == 1 and t.shape[2] == seq:
        return t[0].transpose(0, 1)
    return t


@dataclass
class _Flow:
    """Where a tensor's value comes from: compute ops, whether a cast lies on the way, and
    ``base``: the value before that cast, in this tensor's layout (None when not known)."""

    sources: tuple[int, ...]
    cast: bool = False
    base: torch.Tensor | None = None


class OpRecorder(TorchDispatchMode):
    """Active only between ``open(x)`` and ``close()`` (one module call); records ``ops``.
    ``seq``: the sequence length, for ``token_major``."""

    def __init__(self, seq: int) -> None:
        super().__init__()
        self.seq = seq
        self.ops: list[Op] = []
        self.input: torch.Tensor | None = None
        self.opened = 0
        self._active = False
        self._flow: dict[int, _Flow] = {}
        self._alive: list[torch.Tensor] = []  # keeps the ids in _flow unique while recording

    def open(self, x: torch.Tensor) -> None:
        """The module starts on input ``x``; only its first call is recorded."""
        self.opened += 1
        if self.opened == 1:
            self.input = token_major(x.detach(), self.seq).clone()
            self._track(x, _Flow((MODULE_INPUT,)))
            self._active = True

    def close(self, output: object = None) -> None:
        """The module returned ``output`` (a tensor, or a tuple led by one): recorded as the last
        op, ``output``, so the two sides' module outputs always pair, whatever ran before."""
        out = next((t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)), None)
        if self._active and out is not None and id(out) in self._flow:
            self._add("output", "output", [(out, self._flow[id(out)])], out, [out])
        self._active = False
        self._flow.clear()
        self._alive.clear()

    def _track(self, t: torch.Tensor, flow: _Flow) -> None:
        self._flow[id(t)] = flow
        self._alive.append(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self._active:
            self._record(func, args, kwargs or {}, out)
        return out

    def _record(self, func, args, kwargs, out) -> None:
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        flows = [(a, self._flow[id(a)]) for a in ins if id(a) in self._flow]
        if not flows:
            return  # weights, tables, masks: no activation in, nothing to compare
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        name = func.overloadpacket.__name__
        floating = [o for o in outs if o.is_floating_point()]
        if func.is_view or name in PASS_THROUGH or not floating:
            self._pass_on(func, args, kwargs, flows, outs)
            return
        self._add(name, role_of_stack(sys._getframe()), flows, floating[0], outs, ins)

    def _add(self, name: str, role: str, flows: list[tuple[torch.Tensor, _Flow]], out: torch.Tensor,
             outs: list[torch.Tensor], ins: list[torch.Tensor] | None = None) -> None:
        ins = [a for a, _ in flows] if ins is None else ins
        op = Op(index=len(self.ops), name=name, family=family(name), role=role,
                in_dtypes=tuple(_dtype(a) for a in ins if a.is_floating_point()), out_dtype=_dtype(out),
                out=token_major(out.detach(), self.seq).clone(),
                args=tuple(self._compared(a, f) for a, f in flows),
                arg_sources=tuple(f.sources for _, f in flows), seq=self.seq)
        self.ops.append(op)
        for o in outs:
            self._track(o, _Flow((op.index,)))

    def _pass_on(self, func, args, kwargs, flows: list[tuple[torch.Tensor, _Flow]], outs: list[torch.Tensor]) -> None:
        """Outputs of a view, copy or cast carry their input's sources on; after a cast, the
        same op is run on the value before the cast too, so ``before`` keeps the arg's layout."""
        sources = tuple(dict.fromkeys(s for _, f in flows for s in f.sources))
        (a, f), single = flows[0], len(flows) == 1
        casting = func.overloadpacket.__name__ == "_to_copy" and outs[0].dtype != a.dtype
        if not single:
            bases = [None] * len(outs)
        elif f.cast:
            bases = [f.base] * len(outs) if casting or f.base is None else _rerun(func, args, kwargs, a, f.base, outs)
        else:
            bases = [a if casting else None] * len(outs)
        cast = casting or any(f.cast for _, f in flows)
        for o, base in zip(outs, bases):
            self._track(o, _Flow(sources, cast and base is not None, base))

    def _compared(self, arg: torch.Tensor, flow: _Flow) -> Arg:
        """The argument as the other side's is compared with: itself and its value before a cast."""
        before = flow.base if flow.cast else None
        return Arg(token_major(arg.detach(), self.seq).clone(),
                   None if before is None else token_major(before.detach(), self.seq).clone())


def _rerun(func, args, kwargs, arg: torch.Tensor, before: torch.Tensor, outs: list[torch.Tensor]
           ) -> list[torch.Tensor | None]:
    """``func`` (a view or copy) applied to ``before`` in place of ``arg``: the uncast value in
    the layout the op will read. None where it does not apply (other outputs, other dtypes) or
    would write (``copy_``, ``index_put_``: running them again would change the engine's values)."""
    if func._schema.is_mutable:
        return [None] * len(outs)
    swap = lambda x: before if x is arg else x  # noqa: E731
    try:
        again = func(*tree_map(swap, args), **tree_map(swap, kwargs))
    except (RuntimeError, TypeError):
        return [None] * len(outs)
    found = [t for t in tree_flatten(again)[0] if isinstance(t, torch.Tensor)]
    return found if len(found) == len(outs) else [None] * len(outs)


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")

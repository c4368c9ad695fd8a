"""One forward on an accelerator, held on the device until it ends: then one copy, one sync.

Why: reading a device tensor on the host (``.item()``, ``.tolist()``, ``.cpu()``, ``bool()``,
a ``nonzero``) waits until the device has run everything queued before it. Once per site and
statistic that turned a 4 ms forward on an H200 into 30 ms (376 waits per stats capture of
41 sites): the host could no longer queue the next layer while the device ran this one.

So while a forward runs on a device, nothing the Tracker does reads a value: per-site stats
are computed by device kernels into small float64 tensors, the token rows (request, position,
token id, padding) and the derived sites' next-token targets likewise stay on the device,
and tensor mode starts one asynchronous copy per site into pinned host memory. When the
forward ends (the root module's forward hook, or the next forward of an engine that marks
none), every small tensor goes to the host in one concatenated copy, the host waits once,
and only then does the row bookkeeping that needs values (the token table, padding,
``token_filter``, the budget).

``on_device`` is the one place that decides which path a value takes; the tests force the
device path on CPU tensors by replacing it, so the code a CUDA run takes is checked for
host reads on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from aligntools.tracker.token_meta import TokenMeta, TokenMetaLike


def on_device(t: torch.Tensor) -> bool:
    """Whether ``t`` lives where a host read waits for queued work (not the CPU)."""
    return t.device.type != "cpu"


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` copied to the host without waiting: into pinned memory with a non-blocking copy
    from CUDA (its values are there after ``synchronize``); a plain copy on the CPU."""
    if not t.is_cuda:
        return t.clone()
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return out.copy_(t, non_blocking=True)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device``'s current stream (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def next_tokens(meta: TokenMetaLike) -> torch.Tensor:
    """[N] int64 on the meta's device: the token of the next row of the same request at the
    next position, -1 where this forward has none (the next token comes later, or never).

    Rows of one request are consecutive and in position order in every adapter's layout, so
    the successor is the next row; a padding row (``valid`` False) is no successor."""
    req, pos, tok = meta.request, meta.position, meta.token_id  # [N] each
    follows = (req[1:] == req[:-1]) & (pos[1:] == pos[:-1] + 1)  # [N-1]
    valid = getattr(meta, "valid", None)
    if valid is not None:
        follows &= valid[1:]
    return torch.cat([torch.where(follows, tok[1:], -1), tok.new_full((min(1, len(tok)),), -1)])


@dataclass
class Entry:
    """One emitted site of the forward: its values held for the host (``data``: device stats
    [N, 8] or host tensor rows, copied or borrowed), or, for ``logits`` feeding the derived
    sites, the device pieces of their log-softmax (``derived``, a ``DeviceLogits``)."""

    site: str
    meta: TokenMetaLike
    data: object
    dtype: str  # the engine's dtype, the variable's ``dtype`` attr
    stats: bool = False  # ``data`` is device stats, brought over in the one copy
    derived: object | None = None


@dataclass
class HostForward:
    """What ``PendingForward.to_host`` returns: every entry with its small tensors on the host."""

    entries: list[Entry]
    numbers: dict[int, torch.Tensor]  # id(device tensor) -> its host copy
    metas: dict[int, tuple[TokenMeta, torch.Tensor | None]]  # id(device meta) -> (host meta, valid rows)


@dataclass
class PendingForward:
    """The device side of one forward (one engine ``step``) until it ends."""

    step: int
    device: torch.device
    entries: list[Entry] = field(default_factory=list)
    _numbers: list[torch.Tensor] = field(default_factory=list)  # small device tensors for the one copy
    _metas: dict[int, TokenMetaLike] = field(default_factory=dict)
    _targets: dict[int, torch.Tensor] = field(default_factory=dict)

    def add(self, entry: Entry, *numbers: torch.Tensor | None) -> None:
        """Hold ``entry``; ``numbers`` are its small device tensors to bring over in the one copy."""
        m = entry.meta
        if id(m) not in self._metas:
            self._metas[id(m)] = m
            valid = getattr(m, "valid", None)
            self._numbers += [m.request, m.position, m.token_id] + ([valid] if valid is not None else [])
        self._numbers += [t for t in numbers if t is not None]
        self.entries.append(entry)

    def targets(self, meta: TokenMetaLike) -> torch.Tensor:
        """``next_tokens(meta)``, once per meta."""
        if id(meta) not in self._targets:
            self._targets[id(meta)] = next_tokens(meta)
        return self._targets[id(meta)]

    def to_host(self) -> HostForward:
        """One copy of every small tensor (as float64: ids, positions and stats are exact
        below 2**53), one wait, then the host views of each."""
        flat = [t.reshape(-1).to(torch.float64) for t in self._numbers]
        host = host_copy(torch.cat(flat)) if flat else torch.empty(0, dtype=torch.float64)
        synchronize(self.device)
        parts = host.split([t.numel() for t in flat])
        numbers = {id(t): p.reshape(t.shape).to(t.dtype) for t, p in zip(self._numbers, parts)}
        metas = {}
        for key, m in self._metas.items():
            valid = getattr(m, "valid", None)
            kept = None if valid is None or bool(numbers[id(valid)].all()) else torch.nonzero(numbers[id(valid)])[:, 0]
            pick = (lambda t: t) if kept is None else (lambda t: t[kept])
            metas[key] = (TokenMeta(pick(numbers[id(m.request)]), pick(numbers[id(m.position)]),
                                    pick(numbers[id(m.token_id)]), m.step), kept)
        return HostForward(self.entries, numbers, metas)

"""Token layout of a batched ``[batch, seq]`` forward (transformers, plain nn.Module).

Why a separate piece: hooks see ``[B, S, ...]`` tensors (or ``[B*S, ...]`` inside MoE
blocks) with padding, while a capture is flat over real tokens. One ``ForwardLayout`` per
forward call computes, from the call's own arguments, which rows are real tokens and their
(request, position, token id, step), and maps every hooked tensor onto those rows.
"""

from __future__ import annotations

import torch

import aligntools.tracker.pending as pending
from aligntools.tracker.token_meta import TokenMeta


class ForwardLayout:
    """Rows of one forward call. ``step`` counts forwards since the prefill of this call.

    Positions come from ``position_ids`` when given, else from the attention mask
    (``cumsum - 1``, which handles left padding), else ``past_len + arange(seq)``.

    On a device (``pending.on_device``) nothing is read: the meta stays on the device with
    every row, padding marked by ``valid``, and which rows are real is decided on the host
    after the forward (``Recorder.end_forward``).
    """

    def __init__(self, input_ids: torch.Tensor | None, embeds: torch.Tensor | None,
                 attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
                 past_len: int, step: int) -> None:
        ref = input_ids if input_ids is not None else embeds
        if ref is None or ref.dim() < 2:
            raise ValueError("cannot infer the token layout: expected input_ids [batch, seq] "
                             "(or inputs_embeds [batch, seq, hidden])")
        b, s = ref.shape[0], ref.shape[1]
        self.batch, self.seq = b, s
        device = ref.device
        if input_ids is not None:
            tokens = input_ids.reshape(b, s)
        else:
            tokens = torch.full((b, s), -1, dtype=torch.long, device=device)
        valid = torch.ones(b, s, dtype=torch.bool, device=device)
        if attention_mask is not None and attention_mask.dim() == 2:
            valid = attention_mask[:, -s:].bool()
        if position_ids is not None:
            positions = position_ids.reshape(-1, s).expand(b, s)
        elif attention_mask is not None and attention_mask.dim() == 2:
            positions = (attention_mask.long().cumsum(-1) - 1)[:, -s:]
        else:
            positions = past_len + torch.arange(s, device=device).expand(b, s)
        requests = torch.arange(b, device=device)[:, None].expand(b, s)
        self._grid = (requests, positions, tokens, valid)  # each [B, S]
        self._on_device = pending.on_device(ref)
        self._masked = attention_mask is not None and attention_mask.dim() == 2
        self._step = step
        self._tails: dict[int, tuple[torch.Tensor | None, TokenMeta]] = {}
        self.keep, self.meta = self._tail(s)

    def _tail(self, width: int) -> tuple[torch.Tensor | None, TokenMeta]:
        """(kept flat indices or None, meta) of the last ``width`` positions of each row."""
        if width not in self._tails and self._on_device:  # all rows, read nowhere
            requests, positions, tokens, valid = (t[:, -width:].reshape(-1) for t in self._grid)
            self._tails[width] = (None, TokenMeta(requests.long(), positions.long(), tokens.long(), self._step,
                                                  valid if self._masked else None))
        if width not in self._tails:
            requests, positions, tokens, valid = (t[:, -width:] for t in self._grid)
            flat_valid = valid.reshape(-1)
            keep = None if bool(flat_valid.all()) else torch.nonzero(flat_valid)[:, 0]
            pick = (lambda t: t.reshape(-1)) if keep is None else (lambda t: t.reshape(-1)[keep])
            meta = TokenMeta(request=pick(requests).long().cpu(), position=pick(positions).long().cpu(),
                             token_id=pick(tokens).long().cpu(), step=self._step)
            self._tails[width] = (keep, meta)
        return self._tails[width]

    def rows(self, value: torch.Tensor) -> tuple[torch.Tensor, TokenMeta] | None:
        """``value`` [B, S, ...] or [B*S, ...] -> ([N, ...] real-token rows, their meta).

        ``[B, s, ...]`` with s < S is the last s positions (transformers' ``logits_to_keep``
        during generate); anything else that is not per token gives None.
        """
        b, s = self.batch, self.seq
        if value.dim() >= 3 and value.shape[0] == b and value.shape[1] <= s:
            width = value.shape[1]
            flat = value.reshape(b * width, *value.shape[2:])
        elif value.dim() >= 1 and value.shape[0] == b * s:
            width, flat = s, value
        else:
            return None
        keep, meta = self._tail(width)
        return (flat if keep is None else flat[keep.to(flat.device)]), meta


def call_inputs(args: tuple, kwargs: dict) -> dict:
    """The layout-relevant arguments of a model call, positional or keyword."""
    input_ids = kwargs.get("input_ids", args[0] if args and isinstance(args[0], torch.Tensor) else None)
    return {"input_ids": input_ids, "embeds": kwargs.get("inputs_embeds"),
            "attention_mask": kwargs.get("attention_mask"), "position_ids": kwargs.get("position_ids"),
            "past_len": past_length(kwargs.get("past_key_values"))}


def past_length(cache: object) -> int:
    """Tokens already in a transformers cache (0 for None or an empty cache)."""
    if cache is None:
        return 0
    get = getattr(cache, "get_seq_length", None)
    if get is not None:
        return int(get())
    try:  # legacy tuple-of-tuples cache: [layer][k/v] -> [B, H, T, D]
        return int(cache[0][0].shape[-2])
    except (TypeError, IndexError, AttributeError):
        return 0

"""``Engine``: the minirl inference engine (rollouts for RL, the inference side of alignment).

It loads the same HF checkpoint as the trainer and computes the way inference engines do
(fused projections, fused add+RMSNorm, cached RoPE tables, KV-cache decode, batched
sampling); every numerically relevant choice is a ``Knobs`` field. Generation runs a
batched prefill, then one token per step for all live sequences; finished sequences leave
the batch (their KV-cache rows are compacted away).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

import kernels
from minirl.engine import archs
from minirl.engine.batch import ForwardBatch
from minirl.engine.checkpoint import read_config, read_safetensors
from minirl.engine.config import ModelSpec
from minirl.engine.knobs import Knobs
from minirl.engine.kv_cache import KVCache
from minirl.engine.ops import resolve_dtype
from minirl.engine.sampling import SamplingParams, sample
from minirl.engine.tap import Tap, TapHandle
from minirl.engine.weight_map import WeightMap
from minirl.engine.rollout import Rollout


class Engine:
    """Inference engine over an HF checkpoint. Build with ``Engine.from_pretrained``.

    Step numbering (taps' ``meta.step``): 0 is the prefill (of ``score`` or of ``generate``'s
    prompts); decode step ``k`` feeds generated token ``k - 1``. Every generated token is fed
    once, the last one included (its logits are unused), so routing and taps cover every
    position of ``prompt + generated`` exactly once, as the trainer's forward does.
    """

    def __init__(self, config: dict, hf_weights: Mapping[str, torch.Tensor], *,
                 dtype: str | torch.dtype = "float32", knobs: Knobs | None = None) -> None:
        self.config = config
        self.spec: ModelSpec
        self.spec, arch = archs.resolve(config)
        self.knobs = knobs if knobs is not None else Knobs.typical_inference()
        if not isinstance(self.knobs, Knobs):
            raise TypeError(f"knobs must be a minirl.Knobs (e.g. Knobs.aligned()); got {type(self.knobs).__name__}")
        self.dtype = resolve_dtype(dtype)
        self.knobs.validate(self.spec, self.dtype)
        self.model = arch.model(self.spec, self.knobs, self.dtype)
        self._weight_map = WeightMap(self.spec, arch.recipes(self.spec))
        self.model.load(self._weight_map.fuse(hf_weights))
        self._taps: list[Callable] = []
        self.path: Path | None = None  # the checkpoint directory, when loaded from one

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: str | torch.dtype = "float32",
                        knobs: Knobs | None = None, device: str | torch.device = "cpu") -> "Engine":
        """Load ``config.json`` + safetensors from ``path``. Runs on CPU (``device="cpu"``)."""
        if torch.device(device).type != "cpu":
            raise NotImplementedError(f"device={device!r}: the minirl engine runs on CPU only for now")
        config = read_config(path)
        archs.resolve(config)  # an unsupported model fails before its weights are read
        engine = cls(config, read_safetensors(path), dtype=dtype, knobs=knobs)
        engine.path = Path(path)
        return engine

    # ------------------------------------------------------------------ introspection
    @property
    def arch(self) -> str:
        return self.spec.arch

    @property
    def n_layers(self) -> int:
        return self.spec.n_layers

    @property
    def moe_layers(self) -> list[int]:
        return list(self.spec.moe_layers)

    def add_tap(self, fn: Tap) -> TapHandle:
        """Call ``fn(site, value, meta)`` at every site (aligntools.sites), prefill and decode."""
        self._taps.append(fn)
        return TapHandle(self._taps, fn)

    # ------------------------------------------------------------------ weights
    def load_weights(self, model_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor]) -> None:
        """In-place weight sync from the training model (HF names, either HF layout).

        Everything is validated before anything is copied: on a mismatch the error lists the
        first offending names and the engine keeps its old weights.
        """
        if isinstance(model_or_state_dict, torch.nn.Module):
            sd = model_or_state_dict.state_dict()
        elif isinstance(model_or_state_dict, Mapping):
            sd = model_or_state_dict
        else:
            raise TypeError(f"load_weights takes the training model (an nn.Module) or its state_dict() "
                            f"(a mapping of HF names to tensors); got {type(model_or_state_dict).__name__}")
        self.model.load(self._weight_map.fuse(sd))

    # ------------------------------------------------------------------ scoring
    @torch.no_grad()
    def score(self, token_ids: list[list[int]]) -> list[torch.Tensor]:
        """Prefill-only logprobs: for each sequence, float32 [len - 1] with entry ``t - 1`` =
        raw log p(token t | tokens < t). The inference-side twin of the trainer's forward."""
        self._check_sequences(token_ids, "token_ids", room=0)
        out: list[torch.Tensor] = []
        for group in self._groups(len(token_ids)):
            seqs = token_ids[group]
            batch = ForwardBatch.prefill(seqs, list(range(group.start, group.stop)), cache_start=None)
            logits, _ = self.model.forward(batch, None, self._taps)  # [N, V]
            logp = logits.float().log_softmax(-1)  # [N, V]
            for s, lp in zip(seqs, logp.split(batch.seq_lens)):
                out.append(lp[:-1].gather(1, torch.tensor(s[1:])[:, None])[:, 0])
        return out

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams | None = None) -> list[Rollout]:
        """Sample ``params.n`` continuations per prompt; one ``Rollout`` per sample, prompt-major."""
        params = params if params is not None else SamplingParams()
        self._check_sequences(prompts, "prompts", room=1)
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2 ** 62, ()))
        rows = [list(p) for p in prompts for _ in range(params.n)]  # rollout r -> its prompt
        r_total, spec = len(rows), self.spec
        stop_ids = torch.tensor(sorted(set(params.stop_token_ids)
                                       | (set() if params.ignore_eos else set(spec.eos_token_ids))),
                                dtype=torch.long)
        plens = torch.tensor([len(p) for p in rows])  # [R]
        budget = (spec.max_positions - plens).clamp(max=params.max_new_tokens)  # [R] new tokens allowed
        t_max = int(budget.max())
        recompute = self.knobs.decode == "recompute"
        cache = None if recompute else self.model.new_cache(
            r_total, int((plens + budget).max()), resolve_dtype(self.knobs.kv_cache_dtype, self.dtype))

        tokens = torch.zeros(r_total, t_max, dtype=torch.long)
        logprobs = torch.zeros(r_total, t_max)
        processed = torch.zeros(r_total, t_max) if params.return_processed_logprobs else None
        routing = (torch.zeros(r_total, t_max, len(spec.moe_layers), spec.top_k, dtype=torch.long)
                   if spec.moe_layers else None)
        n_gen = budget.clone()  # rows that end by length; a row that stops gets its count then
        finish_stop = torch.zeros(r_total, dtype=torch.bool)

        if self.knobs.share_prefill and cache is not None and params.n > 1:
            # Each prompt once into cache rows 0..len(prompts)-1, then spread to its n samples.
            first = list(range(0, r_total, params.n))  # each prompt's first rollout (taps' request id)
            logits, prompt_routing = self._prefill([list(p) for p in prompts], first, cache)
            owner = torch.arange(r_total) // params.n  # rollout -> its prompt's prefilled row
            cache.keep(owner)
            logits = logits[owner]
            prompt_routing = None if prompt_routing is None else [prompt_routing[i] for i in owner.tolist()]
        else:
            logits, prompt_routing = self._prefill(rows, list(range(r_total)), cache)  # [R, V], [P, n_moe, k]s
        alive = torch.arange(r_total)  # rollout id of each live row (= its KV-cache row)
        t, first_end = 0, int(budget.min())  # decode steps after which the first row ends by length
        # inference_mode: no version counters or autograd keys on the step's temporaries (~15 %
        # of a decode step); what the loop writes to, and so what the rollouts hold, was
        # allocated above as normal tensors. trusted: the prefill validated the kernel arguments.
        with torch.inference_mode(), kernels.trusted():
            while alive.numel():
                tok, lp, plp = sample(logits, params, seed, alive, t)  # [B] each
                tokens[alive, t], logprobs[alive, t] = tok, lp
                if processed is not None:
                    processed[alive, t] = plp
                stopped = (tok[:, None] == stop_ids).any(-1) if stop_ids.numel() else None  # [B]
                # Feed the sampled tokens, including the final ones (R3 routing of every token).
                logits, step_routing = self._feed(rows, alive, tokens, t, cache)
                if routing is not None:
                    routing[alive, t] = step_routing
                t += 1
                if stopped is None and t < first_end:  # no row can have ended: no tensor reads
                    continue
                done = budget[alive] <= t  # [B]
                if stopped is not None:
                    finish_stop[alive] = stopped
                    n_gen[alive[stopped]] = t
                    done |= stopped
                if bool(done.any()):
                    keep = (~done).nonzero()[:, 0]
                    alive, logits = alive[keep], logits[keep]
                    if keep.numel():
                        first_end = int(budget[alive].min())
                        if cache is not None:
                            cache.keep(keep)

        return [Rollout(
            prompt_ids=rows[r], token_ids=tokens[r, : n_gen[r]].tolist(),
            logprobs=logprobs[r, : n_gen[r]].clone(),
            finish_reason="stop" if bool(finish_stop[r]) else "length",
            processed_logprobs=None if processed is None else processed[r, : n_gen[r]].clone(),
            routed_experts=None if routing is None else routing[r, : n_gen[r]].clone(),
            prompt_routed_experts=None if prompt_routing is None else prompt_routing[r],
        ) for r in range(r_total)]

    def _prefill(self, rows: list[list[int]], requests: list[int], cache: KVCache | None
                 ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Prefill ``rows`` (taps' request ids ``requests``) into cache rows 0..len(rows)-1 ->
        (last-position logits [len(rows), V], per-row prompt routing [P, n_moe, k] or None)."""
        logits, routing = [], []
        for group in self._groups(len(rows)):
            batch = ForwardBatch.prefill(rows[group], requests[group], cache_start=group.start)
            lg, rt = self.model.forward(batch, cache, self._taps, logits_rows=batch.last_rows)
            logits.append(lg)
            if rt is not None:
                routing += list(rt.split(batch.seq_lens))
        return _cat(logits), (routing or None)

    def _feed(self, rows: list[list[int]], alive: torch.Tensor, tokens: torch.Tensor, t: int,
              cache: KVCache | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decode step ``t + 1``: feed token ``t`` of every live row -> (next-token logits [B, V],
        routing of the fed tokens [B, n_moe, k] or None). ``tokens`` is [R, T_max]."""
        logits, routing = [], []
        for group in self._groups(alive.numel()):
            ids = alive[group]  # rollout ids
            if cache is None:  # decode="recompute": the whole prefix again, as the trainer does
                seqs = [rows[r] + tokens[r, : t + 1].tolist() for r in ids.tolist()]
                batch = ForwardBatch.prefill(seqs, ids.tolist(), cache_start=None, step=t + 1,
                                             emit_last_only=True)
                lg, rt = self.model.forward(batch, None, self._taps, logits_rows=batch.last_rows)
            else:
                starts = [len(rows[r]) for r in ids.tolist()]  # prompt lengths
                batch = ForwardBatch.decode_step(tokens[ids, t], torch.tensor(starts) + t, ids, group, t + 1,
                                                 span=(min(starts) + t, max(starts) + t))
                lg, rt = self.model.forward(batch, cache, self._taps)
            logits.append(lg)
            if rt is not None:
                routing.append(rt)
        return _cat(logits), (_cat(routing) if routing else None)

    def _groups(self, n: int) -> list[slice]:
        """Batches of rows computed together: all at once, or one by one when batch-invariant."""
        return [slice(i, i + 1) for i in range(n)] if self.knobs.batch_invariant else [slice(0, n)]

    def _check_sequences(self, seqs: list[list[int]], what: str, room: int) -> None:
        if not isinstance(seqs, list) or not all(isinstance(s, (list, tuple)) for s in seqs):
            raise TypeError(f"{what} must be a list of token-id lists (use tensor.tolist())")
        if not seqs:
            raise ValueError(f"{what} is empty: pass a non-empty list of token-id lists")
        limit, vocab = self.spec.max_positions - room, self.spec.vocab_size
        for i, s in enumerate(seqs):
            if len(s) == 0:
                raise ValueError(f"{what}[{i}] is empty: every sequence needs at least one token")
            if len(s) > limit:
                raise ValueError(
                    f"{what}[{i}] has {len(s)} tokens but the model's max_position_embeddings is "
                    f"{self.spec.max_positions}" + (" (one position must stay free to generate)" if room else "")
                    + f"; truncate it to at most {limit} tokens")
            kinds = {type(t).__name__ for t in s if isinstance(t, bool) or not isinstance(t, int)}
            if kinds:
                raise TypeError(f"{what}[{i}] holds {', '.join(sorted(kinds))} values; token ids must be ints "
                                f"(tokenize text first; use tensor.tolist() on a LongTensor)")
            bad = [t for t in s if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"{what}[{i}] has token ids outside [0, {vocab}): {bad[:5]}")


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat`` that does not copy the single part of an unsplit batch (every decode step)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)

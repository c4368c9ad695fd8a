"""``Engine``: the minirl inference engine (rollouts for RL, the inference side of alignment).

It loads the same HF checkpoint as the trainer and computes the way inference engines do
(fused projections, fused add+RMSNorm, cached RoPE tables, KV-cache decode, batched
sampling); every numerically relevant choice is a ``Knobs`` field. Generation runs a
batched prefill, then one token per step for all live sequences; finished sequences leave
the batch (their KV-cache rows are compacted away). The host decides what each step does
(``scheduler``), the runner computes it on the engine's device (``runner``: CPU or CUDA, a
decode step replayed as a CUDA graph where it can be, ``graphs``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import torch

import kernels
from minirl.engine import archs
from minirl.engine.checkpoint import read_config, read_safetensors
from minirl.engine.config import ModelSpec
from minirl.engine.knobs import Knobs
from minirl.engine.graphs import BUCKETS
from minirl.engine.ops import resolve_device, resolve_dtype
from minirl.engine.rollout import Rollout
from minirl.engine.runner import ModelRunner
from minirl.engine.sampling import SamplingParams, sample
from minirl.engine.scheduler import Scheduler
from minirl.engine.tap import Tap, TapHandle
from minirl.engine.weight_map import WeightMap

log = logging.getLogger(__name__)


class Engine:
    """Inference engine over an HF checkpoint. Build with ``Engine.from_pretrained``.

    Step numbering (taps' ``meta.step``): 0 is the prefill (of ``score`` or of ``generate``'s
    prompts); decode step ``k`` feeds generated token ``k - 1``. Every generated token is fed
    once, the last one included (its logits are unused), so routing and taps cover every
    position of ``prompt + generated`` exactly once, as the trainer's forward does.
    """

    def __init__(self, config: dict, hf_weights: Mapping[str, torch.Tensor], *,
                 dtype: str | torch.dtype = "float32", knobs: Knobs | None = None,
                 device: str | torch.device = "cpu", cuda_graphs: bool = True) -> None:
        device = resolve_device(device)
        self.config = config
        self.spec: ModelSpec
        self.spec, arch = archs.resolve(config)
        self.knobs = knobs if knobs is not None else Knobs.typical_inference()
        if not isinstance(self.knobs, Knobs):
            raise TypeError(f"knobs must be a minirl.Knobs (e.g. Knobs.aligned()); got {type(self.knobs).__name__}")
        self.dtype = resolve_dtype(dtype)
        self.knobs.validate(self.spec, self.dtype)
        self.model = arch.model(self.spec, self.knobs, self.dtype, device)
        self._weight_map = WeightMap(self.spec, arch.recipes(self.spec))
        self.model.load(self._weight_map.fuse(hf_weights))
        if self.model.unquantized:
            names = sorted(self.model.unquantized)
            log.warning("weights=%s does not fit %d weights; they stay in full precision (Engine.unquantized "
                        "says why): %s", self.knobs.weights, len(names),
                        ", ".join(names[:6]) + (" ..." if len(names) > 6 else ""))
        self._taps: list[Tap] = []
        self.runner = ModelRunner(self.model, self.knobs, self._taps, cuda_graphs)
        self.path: Path | None = None  # the checkpoint directory, when loaded from one

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: str | torch.dtype = "float32",
                        knobs: Knobs | None = None, device: str | torch.device = "cpu",
                        cuda_graphs: bool = True) -> "Engine":
        """Load ``config.json`` + safetensors from ``path`` onto ``device`` (``"cpu"``, ``"cuda"``,
        ``"cuda:N"`` or a ``torch.device``). ``cuda_graphs``: replay decode steps as CUDA graphs
        on a CUDA device where nothing forces them eager (``decode_path`` says which);
        they change no knob, only the launch overhead (and the reduction order of a padded step)."""
        device = resolve_device(device)  # a bad device fails before the weights are read
        config = read_config(path)
        archs.resolve(config)  # an unsupported model fails before its weights are read
        engine = cls(config, read_safetensors(path), dtype=dtype, knobs=knobs, device=device,
                     cuda_graphs=cuda_graphs)
        engine.path = Path(path)
        return engine

    def to(self, device: str | torch.device) -> "Engine":
        """Move the engine (weights, RoPE table) to ``device``; the next generate allocates its
        KV cache and CUDA graphs there. Returns self."""
        self.model.to(resolve_device(device))
        self.runner = ModelRunner(self.model, self.knobs, self._taps, self.runner.cuda_graphs)
        return self

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

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def unquantized(self) -> dict[str, str]:
        """Weights ``Knobs.weights`` could not apply to (name -> why), kept in full precision."""
        return dict(self.model.unquantized)

    @property
    def decode_path(self) -> str:
        """How the next generate decodes: ``"cuda graphs (buckets 1..256)"`` or ``"eager: <why>"``."""
        reason = self.runner.eager_reason()
        return f"cuda graphs (buckets 1..{BUCKETS[-1]})" if reason is None else f"eager: {reason}"

    def add_tap(self, fn: Tap) -> TapHandle:
        """Call ``fn(site, value, meta)`` at every site (aligntools.sites), prefill and decode."""
        self._taps.append(fn)
        return TapHandle(self._taps, fn)

    # ------------------------------------------------------------------ weights
    def load_weights(self, model_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor]) -> None:
        """In-place weight sync from the training model (HF names, either HF layout), on any
        device: tensors are fused and rounded where they live, then copied device to device.

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
        """Prefill-only logprobs: for each sequence, float32 [len - 1] (on the host) with entry
        ``t - 1`` = raw log p(token t | tokens < t). The inference-side twin of the trainer's forward."""
        self._check_sequences(token_ids, "token_ids", room=0)
        return self.runner.score(token_ids)

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams | None = None) -> list[Rollout]:
        """Sample ``params.n`` continuations per prompt; one ``Rollout`` per sample, prompt-major.

        schedule (``Scheduler``: live rows, budgets, stops, compaction) -> run (``ModelRunner``:
        prefill, one decode step, on the device) -> sample -> postprocess (the rollouts, on the host).
        A step whose logits no token can be drawn from (NaN, +inf, all -inf: a broken model) fails
        the whole call with ``sampling.NonFiniteLogitsError`` naming its rows by rollout id
        (rollout ``r`` is prompt ``r // n``): RL needs every rollout of a batch sound.
        """
        params = params if params is not None else SamplingParams()
        self._check_sequences(prompts, "prompts", room=1)
        seed = params.seed if params.seed is not None else int(torch.randint(0, 2 ** 62, ()))
        rows = [list(p) for p in prompts for _ in range(params.n)]  # rollout r -> its prompt
        dev, spec = self.device, self.spec
        sched = Scheduler(rows, params, spec, dev)
        r_total, t_max = len(rows), sched.t_max
        cache = self.runner.new_cache(r_total, sched.capacity)

        tokens = torch.zeros(r_total, t_max, dtype=torch.long, device=dev)
        logprobs = torch.zeros(r_total, t_max, device=dev)
        processed = torch.zeros(r_total, t_max, device=dev) if params.return_processed_logprobs else None
        routing = (torch.zeros(r_total, t_max, len(spec.moe_layers), spec.top_k, dtype=torch.long, device=dev)
                   if spec.moe_layers else None)

        if self.knobs.share_prefill and cache is not None and params.n > 1:
            # Each prompt once into cache rows 0..len(prompts)-1, then spread to its n samples.
            first = list(range(0, r_total, params.n))  # each prompt's first rollout (taps' request id)
            logits, prompt_routing = self.runner.prefill([list(p) for p in prompts], first, cache)
            owner = torch.arange(r_total) // params.n  # rollout -> its prompt's prefilled row
            cache.keep(owner.to(dev))
            logits = logits[owner.to(dev)]
            prompt_routing = None if prompt_routing is None else [prompt_routing[i] for i in owner.tolist()]
        else:
            logits, prompt_routing = self.runner.prefill(rows, list(range(r_total)), cache)  # [R, V], [P, n_moe, k]s
        alive = sched.alive.to(dev)  # rollout id of each live row (= its KV-cache row), on the device
        # inference_mode: no version counters or autograd keys on the step's temporaries (~15 %
        # of a decode step); what the loop writes to, and so what the rollouts hold, was
        # allocated above as normal tensors. trusted: the prefill validated the kernel arguments.
        with torch.inference_mode(), kernels.trusted():
            while sched.running:
                t = sched.t
                tok, lp, plp = sample(logits, params, seed, sched.alive, t)  # [B] each
                tokens[alive, t], logprobs[alive, t] = tok, lp
                if processed is not None:
                    processed[alive, t] = plp
                stopped = sched.stopped(tok)  # [B] or None, read after the next step is launched
                # Feed the sampled tokens, including the final ones (R3 routing of every token).
                logits, step_routing = self.runner.decode(sched, alive, tokens, cache)
                if routing is not None:
                    routing[alive, t] = step_routing
                keep = sched.advance(stopped)
                if keep is not None:
                    keep = keep.to(dev)
                    alive, logits = alive[keep], logits[keep]
                    if keep.numel() and cache is not None:
                        cache.keep(keep)
        return self._rollouts(sched, tokens.cpu(), logprobs.cpu(), None if processed is None else processed.cpu(),
                              None if routing is None else routing.cpu(), prompt_routing)

    @staticmethod
    def _rollouts(sched: Scheduler, tokens: torch.Tensor, logprobs: torch.Tensor, processed: torch.Tensor | None,
                  routing: torch.Tensor | None, prompt_routing: list[torch.Tensor] | None) -> list[Rollout]:
        """One ``Rollout`` per row from the host copies of the step buffers ([R, T_max, ...])."""
        n_gen = sched.n_gen
        return [Rollout(
            prompt_ids=sched.rows[r], token_ids=tokens[r, : n_gen[r]].tolist(),
            logprobs=logprobs[r, : n_gen[r]].clone(),
            finish_reason="stop" if bool(sched.finish_stop[r]) else "length",
            processed_logprobs=None if processed is None else processed[r, : n_gen[r]].clone(),
            routed_experts=None if routing is None else routing[r, : n_gen[r]].clone(),
            prompt_routed_experts=None if prompt_routing is None else prompt_routing[r],
        ) for r in range(len(sched.rows))]

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


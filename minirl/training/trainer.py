"""The RL loop: rollout -> reward -> advantages -> old logprobs -> corrections -> updates -> sync.

    >>> import minirl
    >>> result = minirl.train(minirl.TrainConfig(steps=10, correction="icepop"))

The training engine is a transformers model, computing in fp32 or, with ``trainer_dtype:
bfloat16``, in bf16 over fp32 master weights (``Trainer.model`` computes, ``Trainer.master`` is
what AdamW steps, checkpoints and the weight sync read); the rollout engine is anything with
``generate`` + ``load_weights`` (``minirl.engines.RolloutEngine``). How mismatched they are is the
experiment variable (``TrainConfig.engine`` / ``engine_dtype``). Every random choice is a pure
function of ``(seed, step)``, so a resumed run reproduces the uninterrupted one exactly.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minirl import tasks
from minirl.invariants import prove_sync, prove_trainer
from minirl.engine import prepack
from minirl.engine.bf16_gemm import Bf16Gemms
from minirl.engine.sampling import SamplingParams
from minirl.engines import RolloutEngine, build_engine

from minirl.algorithms import advantages, corrections, losses, router_replay

from minirl.training import attention, checkpointing, rollout_records
from minirl.training.c3po_loop import C3poGroups
from minirl.training.groups import Drawn, RolloutInputs, SyncGroups
from minirl.training.lifecycle import Lifecycle
from minirl.training.loss_scale import LossScale
from minirl.quiet import quiet
from minirl.training.run_log import RunLog
from minirl.training.sft import encode, warm_start
from minirl.training.train_config import TrainConfig
from minirl.training.trainer_forward import Forward, forward, forward_per_token, needs_forward
from minirl.algorithms.zero_variance import reshape_zero_variance_advantages


@dataclass
class TrainResult:
    out_dir: Path
    log_path: Path
    rows: list[dict]  # the metric rows, also in ``log_path``
    model: torch.nn.Module | None  # None for ``mode: ray`` (the model lives in the trainer actor)


@dataclass
class Batch:
    """One step's rollouts, padded to the longest ``prompt + completion`` (L tokens)."""

    sequences: list[list[int]]
    mask: torch.Tensor  # [B, L-1] 1 at positions predicting a generated token
    logp_infer: torch.Tensor  # [B, L-1] rollout engine's raw logprobs there, 0 elsewhere
    routed: list[torch.Tensor] | None  # per sequence [len, n_moe, k] (R3), None for dense models
    prompt_lens: list[int]  # per sequence, its prompt's length (``shared_prefix`` packing)


class Trainer:
    def __init__(self, config: TrainConfig, engine: RolloutEngine | None = None) -> None:
        import transformers

        self.cfg = c = config
        self.task = tasks.get(c.task, **c.task_kwargs)
        train_set, self.eval_set = tasks.splits(self.task, c.n_train, c.n_eval, c.seed)
        self.model_path = resolve_model(c)
        self.cfg = c = attention.resolved(c)  # the run records the kernel, not `auto`
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.model_path)
        self.device = resolve_device(c.device)
        torch.manual_seed(c.seed)
        dtype = getattr(torch, c.trainer_dtype)
        with quiet(c.progress):  # progress: false silences transformers' "Loading weights" bars too
            load = lambda dtype: transformers.AutoModelForCausalLM.from_pretrained(  # noqa: E731
                self.model_path, dtype=dtype, attn_implementation=c.trainer_attention)
            self.master = load(torch.float32)
            # bf16: a compute copy loaded as `mlab check --train hf:bfloat16,attn=...` loads it (its
            # fp32 buffers, RoPE's inv_freq, stay fp32), then given the master's weights
            self.model = self.master if dtype == torch.float32 else load(dtype)
        # eval mode, and gradients still flow: RL scores the policy itself, so no dropout (Seed-OSS ships
        # residual_dropout 0.1: 0.33 nats of noise on every log-prob), no router jitter, no train-only path
        self.master.to(self.device).eval()
        self.model.to(self.device).eval()
        prove_trainer(self.master)
        self.pairs = compute_pairs(self.model, self.master)
        self.sync_compute()
        # held over every forward and backward of the bf16 copies: their GEMMs as fp32 GEMMs on bf16
        # operands where this CPU has no native bf16 (minirl/engine/bf16_gemm.py); a no-op elsewhere. Not
        # under `trainer_forward: per_token`, whose point is torch's own kernels, op for op, as the engine's
        # `hf_exact` knobs keep them (`PrepackedLinear(exact=True)`): up to summation order is not bit for bit
        emulate = dtype == torch.bfloat16 and self.device.type == "cpu" and c.trainer_forward != "per_token"
        self.gemms = Bf16Gemms() if emulate and prepack.emulates() else contextlib.nullcontext()
        self.loss_scale = LossScale() if dtype == torch.float16 else None  # fp16's narrow exponent
        if c.router_replay != "none" and not router_replay.routers(self.model):
            raise ValueError(f"router_replay={c.router_replay!r} needs an MoE model (Qwen3-MoE, Mixtral); "
                             f"{self.model_path} has no router: set router_replay: none")
        self.ref = None
        if c.kl_coef > 0:
            with quiet(c.progress):
                self.ref = load(dtype)
            self.ref.to(self.device).eval().requires_grad_(False)
        self.opt = torch.optim.AdamW(self.master.parameters(), lr=c.lr, betas=c.betas, weight_decay=c.weight_decay,
                                     fused=True)  # one kernel per step, not a loop over tensors (CPU and CUDA)
        if engine is None:
            with quiet(c.progress):  # vLLM's / SGLang's checkpoint-loading bars follow progress too
                engine = build_engine(c.engine, self.model_path, c.engine_dtype, self.device, rollouts=True)
        prove_sync(engine, self.master)  # a sync that moves an engine's numbers refuses the run
        if c.router_replay == "r3" and not getattr(engine, "returns_routed_experts", True):
            raise ValueError(f"router_replay='r3' replays the rollout engine's routed experts, and "
                             f"{type(engine).__name__} returns none; use router_replay: r2 (record in the "
                             f"trainer's old-logprob pass) or the minirl engine")
        self.out = Path(c.out_dir)
        self.life: Lifecycle | None = None  # while ``run`` runs
        tools = (c.tool_max_turns, c.tool_timeout_s) if tasks.uses_tools(c.task) else None
        self.inputs = RolloutInputs(engine, self.tokenizer, self.problems, train_set, self.verify, tools)
        self.groups = (C3poGroups(c, self.inputs) if c.rollout == "c3po"
                       else SyncGroups(c, self.inputs, lambda: self.log.rows))

    # The rollout engine and the training set live once, in ``inputs`` (what the group sources and
    # the evaluation draw on), so one swapped in later (a wrapper that probes the engine, a
    # benchmark's other side, ``labs.reproduce``'s shared split) serves the rollouts too.
    @property
    def engine(self) -> RolloutEngine:
        return self.inputs.engine

    @engine.setter
    def engine(self, engine: RolloutEngine) -> None:
        self.inputs.engine = engine

    @property
    def train_set(self) -> list[tasks.Problem]:
        return self.inputs.train_set

    @train_set.setter
    def train_set(self, problems: list[tasks.Problem]) -> None:
        self.inputs.train_set = problems

    # ------------------------------------------------------------------ loop
    def run(self, resume: bool = False, overwrite: bool = True) -> TrainResult:
        """Train to ``steps`` in ``out_dir`` under the run lifecycle every mode shares
        (``minirl.training.lifecycle``: the run directory and its lock, config, log, evaluation,
        checkpoints, TensorBoard, curves). ``resume`` continues from ``<out_dir>/checkpoint``
        (values that may change on resume are applied, the others refused); without it, a previous
        run's own files are replaced (``overwrite=False`` refuses instead, as ``mlab train`` does
        without ``--overwrite``). Ctrl-C raises ``RunInterrupted`` saying which checkpoint is intact."""
        with Lifecycle.open(self.cfg, resume, overwrite) as self.life:
            self.life.run(self, resume, self._loop)
        return TrainResult(self.out, self.log.path, self.log.rows, self.master)

    @property
    def log(self) -> RunLog:
        """The run's metric log (its rows feed ``adaptive_group``'s monitor on resume)."""
        return self.life.log

    def _loop(self, first: int) -> None:
        life = self.life
        bar = tqdm(range(first, self.cfg.steps), desc=f"minirl train {self.out.name}", unit="step",
                   disable=not self.cfg.progress, initial=first, total=self.cfg.steps)
        for step in bar:
            held_out = self.held_out() if life.evaluation_due(step) else {}  # before the step's update
            metrics = self.train_step(step)
            life.record(step, {**metrics, **held_out})
            bar.set_postfix(reward=f"{metrics['reward']:.2f}",
                            mismatch=f"{metrics.get('abs_dlogp_mean', math.nan):.1e}")

    def train_step(self, step: int) -> dict[str, float]:
        """Rollout and reward (``self.groups``: sync groups or C3PO++) -> ``learn`` -> weight sync
        (skipped when there was nothing to train on or the update was not finite)."""
        t = time.perf_counter()
        drawn: Drawn = self.groups.collect(step, _seed(self.cfg.seed, step, 1))
        time_rollout = time.perf_counter() - t
        if self.cfg.record_rollouts and drawn.rollouts:  # the engine's rollouts as sampled, before any update
            rollout_records.save(self.life.dir, step, drawn.rollouts, self.cfg.temperature)
        if drawn.rollouts:
            metrics = self.learn(step, drawn.rollouts, drawn.rewards, drawn.group_size)
        else:  # no complete / informative group this step (C3PO++, zero_variance: filter): nothing to learn from
            metrics = {"reward": math.nan, "nan_skipped": 0.0, "no_signal": 1.0, "lr": self.opt.param_groups[0]["lr"]}
        t = time.perf_counter()
        if drawn.rollouts and not metrics["nan_skipped"]:  # weight sync: the engine serves the updated policy
            self.engine.load_weights(self.master)
            if self.device.type == "cuda":  # the copy is queued: time it done, not launched
                torch.cuda.synchronize(self.device)
        return {**metrics, **drawn.metrics, "reward_errors": float(drawn.errors), "time_rollout": time_rollout,
                "time_sync": time.perf_counter() - t}

    def learn(self, step: int, rollouts: list, rewards: torch.Tensor, group_size: int | None = None
              ) -> dict[str, float]:
        """One update on prompt-major ``rollouts`` (``group_size`` per prompt, default the
        config's) with their rewards: advantages -> old logprobs (trainer forward, or bypass) ->
        corrections -> zero-variance reshaping -> minibatch updates. The rollouts' own logprobs
        are pi_infer of whatever policy version sampled each token, so the correction covers the
        engine mismatch and, in async runs, the staleness."""
        with self.gemms:
            return self._learn(step, rollouts, rewards, group_size)

    def _learn(self, step: int, rollouts: list, rewards: torch.Tensor, group_size: int | None) -> dict[str, float]:
        c, t = self.cfg, time.perf_counter()
        g = group_size or c.group_size
        adv = advantages.ADVANTAGES.call(c.advantage, c, rewards, g).to(self.device)
        batch = pack(rollouts, self.device)
        routing = batch.routed if c.router_replay == "r3" else None
        old = None
        if c.old_logprobs == "recompute":
            with torch.no_grad():
                old = self._policy_forward(batch.sequences, batch.prompt_lens, routing,
                                           record_routing=c.router_replay == "r2")
            routing = old.routing if c.router_replay == "r2" else routing
        logp_old = old.logp * batch.mask if old is not None else batch.logp_infer
        weights, mask, metrics = correct(c, logp_old, batch.logp_infer, batch.mask)
        metrics.update(gap_metrics(c, logp_old, batch.logp_infer, batch.mask))
        entropy_old = old.entropy if old is not None else None  # [B, L-1] of pi_old (ESPO, reshaping)
        if c.zero_variance == "reshape":
            adv = reshape(adv, rewards, entropy_old, batch.mask, g, c.zero_variance_alpha)
        logp_ref = None
        if self.ref is not None:
            with torch.no_grad():
                logp_ref = forward(self.ref, batch.sequences).logp
        times = {"time_old_logprobs": time.perf_counter() - t}

        t = time.perf_counter()
        update = self._update(step, batch, adv, logp_old, weights, mask, routing, logp_ref, entropy_old)
        times["time_update"] = time.perf_counter() - t
        update["nan_skipped"] = float(update["nan_skipped"])
        update_entropy = update.pop("_entropy")
        entropy = old.entropy if old is not None else update_entropy
        metrics.update(corrections.masked_token_stats(weights, mask, batch.logp_infer, entropy))
        if c.old_logprobs == "bypass":  # measured on the first minibatch's rows (update.pop("_fresh"))
            metrics.update(bypass_gap(c, update.pop("_fresh"), batch.logp_infer, batch.mask))
        update.pop("_fresh", None)
        lengths = torch.tensor([len(r.token_ids) for r in rollouts], dtype=torch.float32)
        return {"reward": float(rewards.mean()), "accuracy": float((rewards > 0).float().mean()),
                "length": float(lengths.mean()), "entropy": metrics.pop("entropy_all"),
                "lr": self.opt.param_groups[0]["lr"], **metrics, **update, **times,
                **({"loss_scale": self.loss_scale.scale} if self.loss_scale is not None else {})}

    def _policy_forward(self, sequences: list[list[int]], prompt_lens: list[int],
                        routing: list[torch.Tensor] | None = None, record_routing: bool = False) -> Forward:
        """The policy's forward as ``trainer_forward`` shapes it, for the old-logprob pass and the update alike
        (``prompt_lens``: per sequence; they pack the prompts only under ``shared_prefix``)."""
        c = self.cfg
        if c.trainer_forward == "per_token":
            return forward_per_token(self.model, sequences, prompt_lens)
        return forward(self.model, sequences, routing, record_routing=record_routing,
                       prompt_lens=prompt_lens if c.shared_prefix else None)

    def _update(self, step: int, batch: Batch, adv: torch.Tensor, logp_old: torch.Tensor, weights: torch.Tensor,
                mask: torch.Tensor, routing: list[torch.Tensor] | None, logp_ref: torch.Tensor | None,
                entropy_old: torch.Tensor | None = None) -> dict:
        """``epochs`` passes of ``minibatches`` AdamW steps; a non-finite loss or gradient skips
        the whole step (weights untouched: nothing after it can be trusted). A minibatch whose
        gradient is exactly zero (all advantages 0, no KL term) takes no optimizer step: AdamW
        would move the weights anyway on its momentum, and on smollm2-135m such steps undid a
        36-point held-out gain (docs/measurements/2026-11-26-real-model-rl.md). ``opt_skipped``
        logs the share of minibatches skipped. One whose advantages are all 0 with no KL term
        (``needs_forward``) skips its forward and backward too: its loss and gradient are exactly 0,
        known without computing them; ``skipped_minibatches`` counts those, ``no_signal`` marks a
        step where every minibatch was (bypass: their rows' entropy is unmeasured, NaN)."""
        c = self.cfg
        n = len(batch.sequences)
        gen = torch.Generator().manual_seed(_seed(c.seed, step, 2))
        entropy = torch.full_like(batch.logp_infer, math.nan)
        fresh = torch.full_like(batch.logp_infer, math.nan)  # the first minibatch's pi_old, where it ran
        sums: dict[str, float] = {}
        count = skipped = 0
        grad_norm_max = 0.0
        snapshot = None
        for epoch in range(c.epochs):
            for idx in torch.randperm(n, generator=gen).chunk(c.minibatches):
                if not needs_forward(adv[idx], c.kl_coef):
                    skipped += 1
                    continue
                if snapshot is None:  # to roll back minibatches already applied if a later one fails
                    snapshot = copy.deepcopy((self.master.state_dict(), self.opt.state_dict()))
                self.opt.zero_grad()
                loss, m = self._backward(batch, idx, adv, logp_old, weights, mask, routing, logp_ref, entropy_old,
                                         entropy if epoch == 0 else None, fresh if count == 0 else None)
                params = [p for p in self.master.parameters() if p.grad is not None]
                grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
                if torch.isfinite(grad_norm):  # clipping by a non-finite norm would write NaN into every grad
                    torch.nn.utils.clip_grads_with_norm_(params, c.grad_clip, grad_norm)
                if self.loss_scale is not None:
                    self.loss_scale.update(bool(torch.isfinite(grad_norm)))
                if not (torch.isfinite(loss) and torch.isfinite(grad_norm)):
                    self.opt.zero_grad()
                    self.master.load_state_dict(snapshot[0])
                    self.opt.load_state_dict(snapshot[1])
                    self.sync_compute()
                    return {"nan_skipped": True, "_entropy": entropy, "_fresh": fresh}
                no_signal = float(grad_norm) == 0.0  # every advantage 0 and no KL: nothing to learn from
                if not no_signal:  # AdamW would still move the weights on momentum and decay, unguided
                    self.opt.step()
                    self.sync_compute()
                grad_norm_max = max(grad_norm_max, float(grad_norm))
                for k, v in {**m, "loss": float(loss), "grad_norm": float(grad_norm),
                             "opt_skipped": float(no_signal)}.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        total = count + skipped  # a skipped minibatch: loss 0, gradient 0, no optimizer step
        # the loss's own diagnostics (ratio_mean, clip fractions, ESPO's groups...) describe the
        # minibatches that ran; with none, they were not measured: NaN, so every step has the same columns
        ran = {k: v / count for k, v in sums.items()} if count else dict.fromkeys(loss_metric_names(c), math.nan)
        return {**ran, "loss": sums.get("loss", 0.0) / total, "grad_norm": sums.get("grad_norm", 0.0) / total,
                "grad_norm_max": grad_norm_max, "opt_skipped": (sums.get("opt_skipped", 0.0) + skipped) / total,
                "skipped_minibatches": float(skipped), "no_signal": float(count == 0),
                "nan_skipped": False, "_entropy": entropy, "_fresh": fresh}

    def _backward(self, batch: Batch, idx: torch.Tensor, adv: torch.Tensor, logp_old: torch.Tensor,
                  weights: torch.Tensor, mask: torch.Tensor, routing: list[torch.Tensor] | None,
                  logp_ref: torch.Tensor | None, entropy_old: torch.Tensor | None, entropy: torch.Tensor | None,
                  fresh: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """Forward and backward of minibatch ``idx``, ``micro_batch_size`` rows at a time, its
        gradient left in the master's ``.grad`` -> (its loss, its loss's diagnostics). Each
        micro-batch's loss is scaled by ``micro_share`` so that the sum is the minibatch's loss as
        one batch (the normaliser is the minibatch's, in every aggregation mode), and so are the
        diagnostics (exact for ``pg_loss`` and the KL; a token fraction is exact under token-mean).
        ``entropy`` (epoch 0): filled with the rows' update-pass entropy; ``fresh`` (the first
        minibatch that runs, before any optimizer step of this update): with its log-probs, which
        are then pi_old's, so ``old_logprobs: bypass`` still measures the engine mismatch."""
        c = self.cfg
        width = batch.mask.shape[1]
        size = c.micro_batch_size or len(idx)
        policy_agg = POLICY_AGG[c.loss] if c.loss in POLICY_AGG else c.agg  # one micro-batch: share 1 whatever it is
        total = torch.zeros((), device=self.device)
        sums: dict[str, float] = {}
        for part in idx.split(size):
            rows = part.tolist()
            fwd = self._policy_forward([batch.sequences[i] for i in rows], [batch.prompt_lens[i] for i in rows],
                                       None if routing is None else [routing[i] for i in rows])
            logp = torch.nn.functional.pad(fwd.logp, (0, width - fwd.logp.shape[1]))  # [b, L-1]
            if entropy is not None:
                entropy[part] = torch.nn.functional.pad(fwd.entropy, (0, width - fwd.entropy.shape[1]))
            if fresh is not None:
                fresh[part] = logp.detach()
            loss, m = policy_loss(c, logp, logp_old[part], adv[part], mask[part], weights[part],
                                  None if entropy_old is None else entropy_old[part], self.model.config.vocab_size)
            share = micro_share(policy_agg, mask[part], mask[idx])
            loss, m = loss * share, {k: v * share for k, v in m.items()}
            if logp_ref is not None:
                kl, km = losses.kl_penalty(logp, logp_ref[part], mask[part], c.kl_estimator, c.agg)
                kl_share = micro_share(c.agg, mask[part], mask[idx])
                loss, m = loss + c.kl_coef * kl_share * kl, {**m, **{k: v * kl_share for k, v in km.items()}}
            (loss * self._scale).backward()
            self.take_grads()
            total += loss.detach()
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v
        return total, sums

    # ------------------------------------------------------------------ pieces
    def problems(self, step: int) -> list[tasks.Problem]:
        """Data position: epoch-wise seeded shuffles of the training set, read in order."""
        k, n = self.cfg.prompts_per_step, len(self.train_set)
        out = []
        for pos in range(step * k, (step + 1) * k):
            epoch, i = divmod(pos, n)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(_seed(self.cfg.seed, epoch, 3)))
            out.append(self.train_set[int(order[i])])
        return out

    def verify(self, problem: tasks.Problem, text: str) -> tuple[float, bool]:
        """(reward, verifier raised): a verifier that raises gives reward 0 and is counted."""
        try:
            return float(self.task.verify(problem, text)), False
        except Exception:  # noqa: BLE001 - any verifier bug costs one sample, not the run
            return 0.0, True

    def evaluate(self) -> float:
        """Held-out accuracy: the share of held-out problems the greedy policy solves exactly."""
        return self.held_out()["eval_accuracy"]

    def held_out(self) -> dict[str, float]:
        """Greedy completions of the held-out split (with the rollout engine, as it would be
        served) -> ``eval_accuracy`` (exactly correct, ``minirl.tasks.is_correct``) and
        ``eval_reward`` (the mean reward, partial credit included)."""
        prompts = [encode(self.tokenizer, p.prompt)[0] for p in self.eval_set]
        texts = [text for _, text in self.inputs.generate(prompts, self.eval_params())] if prompts else []
        return self.score_held_out(texts)

    def eval_params(self) -> SamplingParams:
        return SamplingParams(n=1, max_new_tokens=self.cfg.max_new_tokens, temperature=0.0)

    def score_held_out(self, texts: list[str]) -> dict[str, float]:
        """``held_out``'s metrics of ``texts``, one per held-out problem (NaN with none)."""
        if not self.eval_set:
            return {"eval_accuracy": math.nan, "eval_reward": math.nan}
        correct, rewards = [], []
        for problem, text in zip(self.eval_set, texts, strict=True):
            rewards.append(self.verify(problem, text)[0])
            try:
                correct.append(tasks.is_correct(self.task, problem, text))
            except Exception:  # noqa: BLE001 - as in verify: a checker bug costs one problem, not the run
                correct.append(False)
        n = len(self.eval_set)
        return {"eval_accuracy": sum(correct) / n, "eval_reward": sum(rewards) / n}

    # ------------------------------------------------------------------ the lifecycle's Policy
    def save_checkpoint(self, path: Path, state: dict) -> None:
        extra = self.loss_scale.state() if self.loss_scale is not None else {}
        checkpointing.save(path, self.master, self.opt, {**state, **extra})

    def load_checkpoint(self, path: Path) -> dict:
        state = checkpointing.load(path, self.master, self.opt)
        if self.loss_scale is not None:
            self.loss_scale.restore(state)
        self.sync_compute()
        return state

    def resumed(self, step: int) -> None:
        """The checkpoint's optimizer groups hold the old values: take the config's (a resume may
        change them), and serve the restored weights."""
        for group in self.opt.param_groups:
            group.update(lr=self.cfg.lr, betas=tuple(self.cfg.betas), weight_decay=self.cfg.weight_decay)
        self.sync_compute()
        self.engine.load_weights(self.master)

    # ------------------------------------------------------------------ mixed precision
    def sync_compute(self) -> None:
        """Round the fp32 master weights into the bf16 compute copy (after every optimizer step,
        rollback and checkpoint load); nothing to do when the trainer computes in fp32."""
        with torch.no_grad():
            for compute, master in self.pairs:
                compute.copy_(master)

    @property
    def _scale(self) -> float:
        """What the loss is multiplied by before the backward (1 but for an fp16 compute copy)."""
        return 1.0 if self.loss_scale is None else self.loss_scale.scale

    def take_grads(self) -> None:
        """Add the compute copy's gradients (bf16/fp16, as its backward made them) to the master's,
        in fp32, unscaled: micro-batches accumulate there, as FSDP's fp32 ``reduce_dtype`` does."""
        for compute, master in self.pairs:
            if compute.grad is not None:
                g = compute.grad.to(torch.float32) / self._scale
                master.grad = g if master.grad is None else master.grad.add_(g)
                compute.grad = None


def compute_pairs(model: torch.nn.Module, master: torch.nn.Module) -> list[tuple[torch.nn.Parameter, torch.nn.Parameter]]:
    """(compute, master) parameters matched by name; none when they are one model (fp32 trainer)."""
    if model is master:
        return []
    masters = dict(master.named_parameters())
    pairs = [(p, masters[name]) for name, p in model.named_parameters()]
    if len(pairs) != len(masters):
        raise RuntimeError(f"the compute copy has {len(pairs)} parameters and the master {len(masters)}: "
                           f"they must be the same architecture")
    return pairs


def resolve_model(c: TrainConfig) -> Path:
    """The checkpoint RL starts from: ``c.model`` after ``c.sft_steps`` of task SFT (cached)."""
    path = Path(c.model)
    if not c.model:
        raise ValueError("model is not set: set model to an HF checkpoint directory (e.g. the path "
                         "`mlab zoo build tiny-qwen3-moe` prints)")
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"model={c.model!r}: no config.json there; pass an HF checkpoint directory "
                                f"(e.g. the path `mlab zoo build tiny-qwen3-moe` prints)")
    return warm_start(path, c.task, c.task_kwargs, steps=c.sft_steps, seed=c.seed, progress=c.progress)


def resolve_device(name: str) -> torch.device:
    """``TrainConfig.device`` -> a device; asking for CUDA where there is none says so."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but torch sees no CUDA device here; use device: auto or cpu")
    return torch.device(name)


def pack(rollouts, device: torch.device | str = "cpu") -> Batch:
    """Rollouts -> padded ``Batch`` (positions ``P-1 .. P+n-2`` predict the n generated tokens).
    A rollout with a ``loss_mask`` (a tool trajectory, ``minirl.tasks.tool_calls``) trains only where it is
    1: tool-response tokens are context, not actions."""
    seqs = [list(r.prompt_ids) + list(r.token_ids) for r in rollouts]
    width = max(len(s) for s in seqs) - 1
    mask = torch.zeros(len(seqs), width)
    logp = torch.zeros(len(seqs), width)
    for i, r in enumerate(rollouts):
        p, n = len(r.prompt_ids), len(r.token_ids)
        loss_mask = getattr(r, "loss_mask", None)
        mask[i, p - 1: p - 1 + n] = 1.0 if loss_mask is None else torch.tensor(loss_mask, dtype=torch.float32)
        logp[i, p - 1: p - 1 + n] = torch.as_tensor(r.logprobs, dtype=torch.float32)
    routed = None
    if getattr(rollouts[0], "routed_experts", None) is not None:
        routed = [torch.cat([r.prompt_routed_experts, r.routed_experts]) for r in rollouts]
    return Batch(seqs, mask.to(device), logp.to(device), routed, [len(r.prompt_ids) for r in rollouts])


POLICY_AGG = {"gspo": "seq-mean-token-mean"}
"""Losses that aggregate otherwise than ``TrainConfig.agg`` says (``policy_loss``); ``espo`` averages
over its own entropy groups and is not split in micro-batches (``TrainConfig.micro_batch_size``)."""


def gap_metrics(c: TrainConfig, logp_old: torch.Tensor, logp_infer: torch.Tensor, mask: torch.Tensor
                ) -> dict[str, float]:
    """The mismatch quantities every arm logs whatever its correction, so arms compare on one
    scale (Ring-1T Fig. 11): ``icepop_band_out``, the share of tokens whose ratio pi_old / pi_infer
    lies outside IcePop's band [``icepop_alpha``, ``icepop_beta``] (what IcePop would mask), and
    ``abs_dprob_mean``, the mean |p_train - p_infer| of the sampled tokens (the max is
    ``abs_dprob_max``, ``corrections.mismatch_metrics``)."""
    m = mask.bool()
    n = max(int(m.sum()), 1)
    log_rho = (logp_old.detach() - logp_infer.detach()).double()
    rho = log_rho.exp()
    outside = m & ((rho < c.icepop_alpha) | (rho > c.icepop_beta))
    dprob = (logp_old.detach().double().exp() - logp_infer.detach().double().exp()).abs()
    return {"icepop_band_out": int(outside.sum()) / n, "abs_dprob_mean": float(dprob[m].sum()) / n}


def bypass_gap(c: TrainConfig, fresh: torch.Tensor, logp_infer: torch.Tensor, mask: torch.Tensor
               ) -> dict[str, float]:
    """The mismatch metrics under ``old_logprobs: bypass``: no old-logprob forward runs, but the
    first minibatch's update forward sees the weights the rollout engine had (no optimizer step
    yet), so its log-probs ``fresh`` [B, L-1] (NaN on rows it did not hold) are pi_old there. The
    metrics cover those rows; NaN when no minibatch ran (every advantage 0)."""
    rows = ~fresh.isnan().all(dim=1)  # [B]
    m = mask * rows[:, None]
    gap = {**corrections.mismatch_metrics(logp_infer, logp_infer, mask), **gap_metrics(c, logp_infer, logp_infer, mask)}
    if not bool(m.any()):
        return dict.fromkeys(gap, math.nan)
    old = torch.where(rows[:, None], fresh, logp_infer)
    return {**corrections.mismatch_metrics(old, logp_infer, m), **gap_metrics(c, old, logp_infer, m)}


def micro_share(agg: str, part_mask: torch.Tensor, whole_mask: torch.Tensor) -> float:
    """The weight of a micro-batch's loss (aggregated over ``part_mask``'s rows alone) in its
    minibatch's (``whole_mask``), so that the weighted sum is the minibatch's loss as one batch:
    its share of the tokens (``token-mean``) or of the sequences (``seq-mean-*``); 1.0 exactly for
    the whole minibatch. ``losses.aggregate`` divides by at least 1, and so does this."""
    if agg == "token-mean":
        return float(part_mask.sum().clamp(min=1.0)) / float(whole_mask.sum().clamp(min=1.0))
    return part_mask.shape[0] / whole_mask.shape[0]


def correct(c: TrainConfig, logp_old: torch.Tensor, logp_infer: torch.Tensor, mask: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """The configured mismatch correction (``corrections.CORRECTIONS``) -> (weights, mask, metrics)."""
    return corrections.CORRECTIONS.call(c.correction, c, logp_old, logp_infer, mask)


def policy_loss(c: TrainConfig, logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                weights: torch.Tensor, entropy_old: torch.Tensor | None = None, vocab_size: int | None = None
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """The configured policy loss (``losses.POLICY_LOSSES``) on [b, T] tensors (``entropy_old`` and
    ``vocab_size``: ESPO's).

    GSPO always aggregates ``seq-mean-token-mean`` whatever ``agg`` says: its objective is a mean
    over sequences of the sequence ratio (GSPO eq. 5; verl forces the same), and ``token-mean``
    would weigh each sequence by its length. ESPO averages over its own entropy groups."""
    return losses.POLICY_LOSSES.call(c.loss, c, logp, logp_old, adv, mask, weights=weights, entropy_old=entropy_old,
                                     vocab_size=vocab_size)


def loss_metric_names(c: TrainConfig) -> tuple[str, ...]:
    """The names of the metrics ``policy_loss`` logs for ``c``, read off one call on a 1x2 dummy
    minibatch (no model involved, microseconds), so a step whose minibatches were all skipped
    still logs them (NaN: not measured)."""
    z = torch.zeros(1, 2)
    with torch.no_grad():
        _, m = policy_loss(c, z, z, torch.zeros(1), torch.ones(1, 2), torch.ones(1, 2), torch.ones(1, 2), 2)
    return tuple(m)


def reshape(adv: torch.Tensor, rewards: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor, group_size: int,
            alpha: float) -> torch.Tensor:
    """Per-sequence GRPO advantages [B] -> per-token [B, T], each zero-variance group's
    reshaped from ``entropy`` (RL-ZVP, CompassMax §2.4.1; ``minirl.algorithms.zero_variance``)."""
    tok = adv[:, None].expand_as(mask).clone()  # [B, T]
    for lo in range(0, len(adv), group_size):
        hi = lo + group_size
        tok[lo:hi] = reshape_zero_variance_advantages(tok[lo:hi], rewards[lo:hi], entropy[lo:hi], mask[lo:hi],
                                                      alpha=alpha)
    return tok


def _seed(seed: int, step: int, stream: int) -> int:
    """A distinct, reproducible seed per (run seed, step, purpose)."""
    return (seed * 1_000_003 + step) * 16 + stream

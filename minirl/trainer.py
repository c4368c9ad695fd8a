"""The RL loop: rollout -> reward -> advantages -> old logprobs -> corrections -> updates -> sync.

    >>> import minirl
    >>> result = minirl.train(minirl.TrainConfig(steps=10, correction="icepop"))

The training engine is a transformers model (fp32); the rollout engine is anything with
``generate`` + ``load_weights`` (``minirl.rollout_engine``). How mismatched they are is the
experiment variable (``TrainConfig.engine`` / ``engine_dtype``). Every random choice is a pure
function of ``(seed, step)``, so a resumed run reproduces the uninterrupted one exactly.
"""

from __future__ import annotations

import copy
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from minirl import SamplingParams, advantages, checkpointing, corrections, losses, router_replay, tasks
from minirl.rollout_engine import RolloutEngine, make_engine
from minirl.run_log import RunLog
from minirl.sft import encode, warm_start
from minirl.train_config import TrainConfig
from minirl.trainer_forward import forward


@dataclass
class TrainResult:
    out_dir: Path
    log_path: Path
    rows: list[dict]  # the metric rows, also in ``log_path``
    model: torch.nn.Module


@dataclass
class Batch:
    """One step's rollouts, padded to the longest ``prompt + completion`` (L tokens)."""

    sequences: list[list[int]]
    mask: torch.Tensor  # [B, L-1] 1 at positions predicting a generated token
    logp_infer: torch.Tensor  # [B, L-1] rollout engine's raw logprobs there, 0 elsewhere
    routed: list[torch.Tensor] | None  # per sequence [len, n_moe, k] (R3), None for dense models


def train(config: TrainConfig | dict | str | os.PathLike, engine: RolloutEngine | None = None,
          resume: bool = False) -> TrainResult:
    """Run RL as ``config`` says (a ``TrainConfig``, a dict of its fields, or a YAML path).
    ``resume=True`` continues from ``<out_dir>/checkpoint`` when it exists."""
    if isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    elif not isinstance(config, TrainConfig):
        config = TrainConfig.from_yaml(config)
    return Trainer(config, engine).run(resume)


class Trainer:
    def __init__(self, config: TrainConfig, engine: RolloutEngine | None = None) -> None:
        import transformers

        self.cfg = c = config
        self.task = tasks.get(c.task, **c.task_kwargs)
        self.train_set, self.eval_set = tasks.splits(self.task, c.n_train, c.n_eval, c.seed)
        self.model_path = resolve_model(c)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.model_path)
        self.device = resolve_device(c.device)
        torch.manual_seed(c.seed)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        self.model.to(self.device).train()
        if c.router_replay != "none" and not router_replay.routers(self.model):
            raise ValueError(f"router_replay={c.router_replay!r} needs an MoE model (Qwen3-MoE, Mixtral); "
                             f"{self.model_path} has no router: set router_replay: none")
        self.ref = None
        if c.kl_coef > 0:
            self.ref = transformers.AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
            self.ref.to(self.device).eval().requires_grad_(False)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=c.lr, betas=c.betas, weight_decay=c.weight_decay,
                                     fused=True)  # one kernel per step, not a loop over tensors (CPU and CUDA)
        self.engine = engine if engine is not None else make_engine(c.engine, self.model_path, c.engine_dtype)
        if c.router_replay == "r3" and not getattr(self.engine, "returns_routed_experts", True):
            raise ValueError(f"router_replay='r3' replays the rollout engine's routed experts, and "
                             f"{type(self.engine).__name__} returns none; use router_replay: r2 (record in the "
                             f"trainer's old-logprob pass) or the minirl engine")
        self.out = Path(c.out_dir)
        self.log = RunLog(self.out / "metrics.nc")
        self.step, self.nan_streak = 0, 0

    # ------------------------------------------------------------------ loop
    def run(self, resume: bool = False) -> TrainResult:
        if resume and (self.out / "checkpoint" / "state.json").exists():
            self._restore()
        bar = tqdm(range(self.step, self.cfg.steps), desc="minirl train", unit="step", disable=not self.cfg.progress,
                   initial=self.step, total=self.cfg.steps)
        for step in bar:
            evaluated = self.cfg.eval_every and step % self.cfg.eval_every == 0
            eval_accuracy = self.evaluate() if evaluated else None  # before the step's update
            metrics = self.train_step(step)
            if evaluated:
                metrics["eval_accuracy"] = eval_accuracy
            self.log.append(step, metrics)
            self.step = step + 1
            bar.set_postfix(reward=f"{metrics['reward']:.2f}",
                            mismatch=f"{metrics.get('abs_dlogp_mean', math.nan):.1e}")
            if metrics["nan_skipped"]:
                self.nan_streak += 1
                if self.nan_streak >= self.cfg.max_nan_steps:
                    raise RuntimeError(
                        f"loss was not finite for {self.nan_streak} steps in a row (last: step {step}); each was "
                        f"skipped and the run stopped. The last checkpoint ({self.out / 'checkpoint'}) is intact; "
                        f"lower lr, enable a correction (icepop/tis), or raise max_nan_steps")
            else:
                self.nan_streak = 0
            every = self.cfg.checkpoint_every
            if every and (self.step % every == 0 or self.step == self.cfg.steps):
                self._save()
        return TrainResult(self.out, self.log.path, self.log.rows, self.model)

    def train_step(self, step: int) -> dict[str, float]:
        """Rollout -> reward -> ``learn`` -> weight sync (skipped when the update was not finite)."""
        c, t = self.cfg, time.perf_counter()
        problems = self.problems(step)
        prompts = [encode(self.tokenizer, p.prompt)[0] for p in problems]
        params = SamplingParams(n=c.group_size, max_new_tokens=c.max_new_tokens, temperature=c.temperature,
                                seed=_seed(c.seed, step, 1))
        rollouts = self.engine.generate(prompts, params)
        time_rollout = time.perf_counter() - t
        rewards, errors = self.rewards(problems, rollouts)
        metrics = self.learn(step, rollouts, rewards)
        t = time.perf_counter()
        if not metrics["nan_skipped"]:  # weight sync: the rollout engine now serves the updated policy
            self.engine.load_weights(self.model)
        return {**metrics, "reward_errors": float(errors), "time_rollout": time_rollout,
                "time_sync": time.perf_counter() - t}

    def learn(self, step: int, rollouts: list, rewards: torch.Tensor) -> dict[str, float]:
        """One update on prompt-major ``rollouts`` (``group_size`` per prompt) with their rewards:
        advantages -> old logprobs (trainer forward, or bypass) -> corrections -> minibatch updates.
        The rollouts' own logprobs are pi_infer of whatever policy version sampled each token, so
        the correction covers the engine mismatch and, in async runs, the staleness."""
        c, t = self.cfg, time.perf_counter()
        adv = advantages.grpo_advantages(rewards, c.group_size, normalize_std=c.advantage == "grpo").to(self.device)
        batch = pack(rollouts, self.device)
        routing = batch.routed if c.router_replay == "r3" else None
        old = None
        if c.old_logprobs == "recompute":
            with torch.no_grad():
                old = forward(self.model, batch.sequences, routing, record_routing=c.router_replay == "r2")
            routing = old.routing if c.router_replay == "r2" else routing
        logp_old = old.logp * batch.mask if old is not None else batch.logp_infer
        weights, mask, metrics = correct(c, logp_old, batch.logp_infer, batch.mask)
        logp_ref = None
        if self.ref is not None:
            with torch.no_grad():
                logp_ref = forward(self.ref, batch.sequences).logp
        times = {"time_old_logprobs": time.perf_counter() - t}

        t = time.perf_counter()
        update = self._update(step, batch, adv, logp_old, weights, mask, routing, logp_ref)
        times["time_update"] = time.perf_counter() - t
        update["nan_skipped"] = float(update["nan_skipped"])
        update_entropy = update.pop("_entropy")
        entropy = old.entropy if old is not None else update_entropy
        metrics.update(corrections.masked_token_stats(weights, mask, batch.logp_infer, entropy))
        if c.old_logprobs == "bypass":  # no trainer forward on the rollout: the gap is unmeasured
            metrics.update({k: math.nan for k in corrections.mismatch_metrics(logp_old, logp_old, mask)})
        lengths = torch.tensor([len(r.token_ids) for r in rollouts], dtype=torch.float32)
        return {"reward": float(rewards.mean()), "accuracy": float((rewards > 0).float().mean()),
                "length": float(lengths.mean()), "entropy": metrics.pop("entropy_all"),
                **metrics, **update, **times}

    def _update(self, step: int, batch: Batch, adv: torch.Tensor, logp_old: torch.Tensor, weights: torch.Tensor,
                mask: torch.Tensor, routing: list[torch.Tensor] | None, logp_ref: torch.Tensor | None) -> dict:
        """``epochs`` passes of ``minibatches`` AdamW steps; a non-finite loss or gradient skips
        the whole step (weights untouched: nothing after it can be trusted)."""
        c = self.cfg
        n, width = len(batch.sequences), batch.mask.shape[1]
        gen = torch.Generator().manual_seed(_seed(c.seed, step, 2))
        entropy = torch.zeros_like(batch.logp_infer)
        sums: dict[str, float] = {}
        count = 0
        snapshot = None
        for epoch in range(c.epochs):
            for idx in torch.randperm(n, generator=gen).chunk(c.minibatches):
                rows = idx.tolist()
                fwd = forward(self.model, [batch.sequences[i] for i in rows],
                              None if routing is None else [routing[i] for i in rows])
                logp = torch.nn.functional.pad(fwd.logp, (0, width - fwd.logp.shape[1]))  # [b, L-1]
                if epoch == 0:
                    entropy[idx] = torch.nn.functional.pad(fwd.entropy, (0, width - fwd.entropy.shape[1]))
                loss, m = policy_loss(c, logp, logp_old[idx], adv[idx], mask[idx], weights[idx])
                if logp_ref is not None:
                    kl, km = losses.kl_penalty(logp, logp_ref[idx], mask[idx], c.kl_estimator, c.agg)
                    loss, m = loss + c.kl_coef * kl, {**m, **km}
                if snapshot is None:  # to roll back minibatches already applied if a later one fails
                    snapshot = copy.deepcopy((self.model.state_dict(), self.opt.state_dict()))
                self.opt.zero_grad()
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.grad_clip)
                if not (torch.isfinite(loss) and torch.isfinite(grad_norm)):
                    self.opt.zero_grad()
                    self.model.load_state_dict(snapshot[0])
                    self.opt.load_state_dict(snapshot[1])
                    return {"nan_skipped": True, "_entropy": entropy}
                self.opt.step()
                for k, v in {**m, "loss": float(loss.detach()), "grad_norm": float(grad_norm)}.items():
                    sums[k] = sums.get(k, 0.0) + v
                count += 1
        return {**{k: v / count for k, v in sums.items()}, "nan_skipped": False, "_entropy": entropy}

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

    def rewards(self, problems: list[tasks.Problem], rollouts) -> tuple[torch.Tensor, int]:
        """Verifier result per rollout (prompt-major, ``group_size`` per problem); the count of
        verifier errors."""
        scored = [self.score(problems[i // self.cfg.group_size], r.token_ids) for i, r in enumerate(rollouts)]
        return torch.tensor([reward for reward, _ in scored]), sum(error for _, error in scored)

    def score(self, problem: tasks.Problem, token_ids: list[int]) -> tuple[float, bool]:
        """(reward, verifier raised): a verifier that raises gives reward 0 and is counted."""
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        try:
            return float(self.task.verify(problem, text)), False
        except Exception:  # noqa: BLE001 - any verifier bug costs one sample, not the run
            return 0.0, True

    def evaluate(self) -> float:
        """Greedy accuracy on the held-out split (with the rollout engine, as it would be served)."""
        if not self.eval_set:
            return math.nan
        prompts = [encode(self.tokenizer, p.prompt)[0] for p in self.eval_set]
        rollouts = self.engine.generate(prompts, SamplingParams(n=1, max_new_tokens=self.cfg.max_new_tokens,
                                                                temperature=0.0))
        ok = 0
        for p, r in zip(self.eval_set, rollouts):
            try:
                ok += bool(self.task.verify(p, self.tokenizer.decode(r.token_ids, skip_special_tokens=True)))
            except Exception:  # noqa: BLE001 - same policy as training rewards
                pass
        return ok / len(self.eval_set)

    def _save(self) -> None:
        checkpointing.save(self.out / "checkpoint", self.model, self.opt,
                           {"step": self.step, "nan_streak": self.nan_streak, "rows": self.log.rows,
                            "config": self.cfg.to_dict()})

    def _restore(self) -> None:
        state = checkpointing.load(self.out / "checkpoint", self.model, self.opt)
        self.step, self.nan_streak = state["step"], state["nan_streak"]
        self.log = RunLog(self.log.path, state["rows"])
        self.log.flush()
        self.engine.load_weights(self.model)


def resolve_model(c: TrainConfig) -> Path:
    """The checkpoint RL starts from: ``c.model`` after ``c.sft_steps`` of task SFT (cached)."""
    path = Path(c.model)
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
    """Rollouts -> padded ``Batch`` (positions ``P-1 .. P+n-2`` predict the n generated tokens)."""
    seqs = [list(r.prompt_ids) + list(r.token_ids) for r in rollouts]
    width = max(len(s) for s in seqs) - 1
    mask = torch.zeros(len(seqs), width)
    logp = torch.zeros(len(seqs), width)
    for i, r in enumerate(rollouts):
        p, n = len(r.prompt_ids), len(r.token_ids)
        mask[i, p - 1: p - 1 + n] = 1.0
        logp[i, p - 1: p - 1 + n] = r.logprobs.float()
    routed = None
    if rollouts[0].routed_experts is not None:
        routed = [torch.cat([r.prompt_routed_experts, r.routed_experts]) for r in rollouts]
    return Batch(seqs, mask.to(device), logp.to(device), routed)


def correct(c: TrainConfig, logp_old: torch.Tensor, logp_infer: torch.Tensor, mask: torch.Tensor):
    """The configured mismatch correction -> (weights, mask, metrics)."""
    if c.correction == "icepop":
        return corrections.icepop(logp_old, logp_infer, mask, c.icepop_alpha, c.icepop_beta)
    if c.correction == "tis":
        return corrections.tis(logp_old, logp_infer, mask, c.correction_level, c.tis_cap)
    if c.correction == "mis":
        return corrections.mis(logp_old, logp_infer, mask, c.correction_level, c.mis_low, c.mis_high)
    return corrections.no_correction(logp_old, logp_infer, mask)


def policy_loss(c: TrainConfig, logp, logp_old, adv, mask, weights):
    if c.loss == "gspo":
        return losses.gspo_loss(logp, logp_old, adv, mask, c.gspo_eps_low, c.gspo_eps_high, weights, c.agg)
    return losses.ppo_clip_loss(logp, logp_old, adv, mask, c.eps_low, c.eps_high, c.dual_clip, weights, c.agg)


def _seed(seed: int, step: int, stream: int) -> int:
    """A distinct, reproducible seed per (run seed, step, purpose)."""
    return (seed * 1_000_003 + step) * 16 + stream

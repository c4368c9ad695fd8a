"""The lab attached to TRL's ``GRPOTrainer`` (pinned release: trl 1.16.0), in up to three lines::

    from aligntools.integrations.trl import attach, rollout_func
    trainer = GRPOTrainer(..., rollout_func=rollout_func("minirl:typical"))  # optional: a lab engine generates
    attach(trainer, records="runs/records", monitor_every=10)                # records + stats every step,
                                                                             # per-site monitor every 10

Why a wrapper and not a ``TrainerCallback``: a callback sees only TRL's post-truncation scalars;
the per-token tensors (``sampling_per_token_logps``, ``old_per_token_logps``, ``completion_mask``)
live inside ``_generate_and_score_completions``, and when TRL skips ``old_per_token_logps`` (its
default, on-policy layout) the trainer's logprobs exist only inside ``_compute_loss``. ``attach``
wraps those two methods on the one trainer instance, returns their results unchanged, and logs
through TRL's own metrics (``trainer._metrics``), so the numbers reach TRL's logger and TensorBoard
with TRL's own. Every TRL internal this needs is named in this module and nowhere else.

``monitor_every=K`` adds the per-site mismatch monitor (``aligntools.integrations.monitor``): right
after a generation, when the engine that generated holds exactly the trainer's weights, both run on
one fixed probe and every site's error goes to TRL's logger and ``records/metrics.nc``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aligntools.integrations.monitor import SiteMonitor, probe_of
from aligntools.integrations.stats import mismatch_stats, records_of, write_step
from minirl import SamplingParams, build_engine
from minirl.training.monitor import DEFAULT_SITES

TRL_VERSION = "1.16.0"
"""The release this module is tested against (requirements.txt pins it)."""


class EngineRollouts:
    """A TRL ``rollout_func`` whose completions come from a lab engine (``minirl:typical``,
    ``minirl:typical,weights=int4``, ``vllm:bfloat16``, ``sglang:bfloat16``, ...).

    Why: it gives a TRL run the rollouts of a real or quantized engine, so the mismatch the lab
    measures is the one such an engine brings. The engine is built on first use from the trainer's
    checkpoint and given the trainer's weights whenever the optimizer has stepped. It returns the
    logprobs TRL expects: under the sampled distribution (``logits / temperature``), as TRL's own
    trainer logprobs are. ``engine``: the built engine (None until the first call), replaceable.
    """

    def __init__(self, spec: str, device: str = "cpu") -> None:
        self.spec = spec
        self.device = device
        self.engine: Any = None
        self._synced_step: int | None = None

    def __call__(self, prompts: list, trainer: Any) -> dict[str, list]:
        """TRL's contract: one completion per prompt given (TRL's sampler already repeats each prompt
        ``num_generations`` times), as ``prompt_ids``, ``completion_ids`` and ``logprobs`` lists."""
        self._sync(trainer)
        prompt_ids = trainer._tokenize_prompts(prompts)[0]  # exactly the ids TRL would generate from
        rollouts = self.engine.generate(prompt_ids, sampling_params(trainer))
        return {"prompt_ids": [list(r.prompt_ids) for r in rollouts],
                "completion_ids": [list(r.token_ids) for r in rollouts],
                "logprobs": [_processed(r, trainer).tolist() for r in rollouts]}

    def _sync(self, trainer: Any) -> None:
        """Build the engine on the first call; afterwards copy the trainer's weights in once per optimizer step."""
        step = trainer.state.global_step
        model = trainer.accelerator.unwrap_model(trainer.model)
        if self.engine is None:
            self.engine = build_engine(self.spec, model.config._name_or_path, device=self.device, rollouts=True)
            self.engine.load_weights(model)
        elif step != self._synced_step:
            self.engine.load_weights(model)
        self._synced_step = step


def rollout_func(spec: str, device: str = "cpu") -> EngineRollouts:
    """``GRPOTrainer(rollout_func=rollout_func("vllm:bfloat16"))``: rollouts from any lab engine spec."""
    return EngineRollouts(spec, device)


def sampling_params(trainer: Any) -> SamplingParams:
    """The trainer's sampling settings as the engine takes them; settings an engine cannot apply are
    refused here, not silently dropped (a dropped one is exactly the bug the audit looks for). The
    seed follows the run's seed and step: rollouts repeat with the run, and the engine draws nothing
    from torch's global RNG, which TRL's batch shuffling also draws from."""
    args = trainer.args
    unsupported = {k: v for k, v in (("min_p", args.min_p), ("repetition_penalty", args.repetition_penalty))
                   if v is not None and v != (1.0 if k == "repetition_penalty" else 0.0)}
    if unsupported:
        raise ValueError(f"rollout_func: the lab's engines do not apply {unsupported}; unset it in GRPOConfig, or "
                         "keep TRL's own generation (no rollout_func) for it")
    return SamplingParams(temperature=trainer.temperature, top_p=args.top_p, top_k=args.top_k or 0,
                          max_new_tokens=trainer.max_completion_length, return_processed_logprobs=True,
                          seed=args.seed + trainer.state.global_step)


def _processed(rollout: Any, trainer: Any) -> torch.Tensor:
    """The rollout's logprobs under the sampled distribution [T]: the engine's processed logprobs, or
    its raw ones where sampling does not change the distribution (T = 1, no truncation)."""
    if rollout.processed_logprobs is not None:
        return rollout.processed_logprobs
    p = sampling_params(trainer)
    if (p.temperature, p.top_p, p.top_k) != (1.0, 1.0, 0):
        raise ValueError(f"rollout_func: this engine returns raw logprobs only, and temperature={p.temperature}, "
                         f"top_p={p.top_p}, top_k={p.top_k} change the sampled distribution; use a minirl engine "
                         "spec, or temperature=1.0, top_p=1.0, top_k=0")
    return rollout.logprobs


@dataclass
class Attachment:
    """What ``attach`` left on a trainer: where records go, the last step's statistics
    (``last_stats``) and monitor reading (``last_reading``), for a script or a test to read without
    parsing logs."""

    trainer: Any
    records: Path | None
    monitor: SiteMonitor | None = None
    monitor_tokens: int = 64
    last_stats: dict[str, float] = field(default_factory=dict)
    last_reading: dict[str, float] = field(default_factory=dict)
    _pending: list[dict[str, torch.Tensor]] = field(default_factory=list)
    _capture: list[torch.Tensor] | None = None
    _probe: torch.Tensor | None = None
    _step: int = 0  # the step of the generation whose statistics are pending

    def after_generation(self, out: dict[str, Any]) -> None:
        """One generation batch: write its records, read the monitor when due; its statistics now if
        TRL computed its own logprobs (``old_per_token_logps``), else once the loss forwards have
        seen every slice."""
        step = self._step = self.trainer.state.global_step
        engine_lp = out.get("sampling_per_token_logps")  # [B, T]
        if engine_lp is None:
            raise RuntimeError(_NO_LOGPROBS)
        mask = out["completion_mask"] * out.get("tool_mask", 1)  # [B, T]
        if self.records is not None:
            write_step(records_of(out["prompt_ids"], out["prompt_mask"], out["completion_ids"], mask, engine_lp,
                                  sampling_of(self.trainer), step, "processed"), self.records, step)
        if self.monitor is not None and self.monitor.due(step):
            self._read(step)
        if "old_per_token_logps" in out:
            self._log(mismatch_stats(out["old_per_token_logps"], engine_lp, mask))

    def after_loss_forward(self, trainer_lp: torch.Tensor, inputs: dict[str, Any]) -> None:
        """One slice's trainer logprobs [b, T] from the loss forward. TRL skips ``old_per_token_logps``
        only when the weights cannot change within a generation batch, so these are them."""
        mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)  # [b, T]
        self._pending.append({"trainer": trainer_lp.detach(), "engine": inputs["sampling_per_token_logps"],
                              "mask": mask})
        if len(self._pending) == self.trainer.args.steps_per_generation:
            cat = {k: torch.cat([p[k] for p in self._pending]) for k in self._pending[0]}  # [B, T] each
            self._pending.clear()
            self._log(mismatch_stats(cat["trainer"], cat["engine"], cat["mask"]))

    def _read(self, step: int) -> None:
        """A monitor reading of the trainer against the engine that just generated (synced to the
        trainer's weights before it did, and the optimizer has not stepped since)."""
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        if self._probe is None:
            dataset = self.trainer.train_dataset
            prompts = dataset[: min(len(dataset), self.monitor_tokens)]["prompt"]
            self._probe = probe_of(self.trainer._tokenize_prompts(prompts)[0], self.monitor_tokens)
        with _own_forward(model):
            self.last_reading = self.monitor.read(step, model, self.trainer.rollout_func.engine, self._probe)
        self._metric(self.last_reading)

    def _log(self, stats: dict[str, float]) -> None:
        """The generation's statistics: into TRL's metrics and, with the monitor on, as a row of the
        records folder's run log."""
        self.last_stats = stats
        self._metric(stats)
        if self.monitor is not None:
            self.monitor.row(self._step, stats)

    def _metric(self, values: dict[str, float]) -> None:
        """Into TRL's metrics: ``GRPOTrainer.log`` averages them over the logging window and sends them
        to every ``report_to`` backend (TensorBoard included) beside ``sampling/...``."""
        for key, value in values.items():
            self.trainer._metrics["train"][key].append(value)


_NO_LOGPROBS = ("attach: the trainer's generation returned no per-token logprobs (TRL's transformers generation "
                "keeps none); pass rollout_func=aligntools.integrations.trl.rollout_func('vllm:bfloat16') or any lab "
                "engine spec, or GRPOConfig(use_vllm=True)")


def attach(trainer: Any, records: str | Path | None = None, monitor_every: int = 0, monitor_sites: str = DEFAULT_SITES,
           monitor_mode: str = "stats", monitor_tokens: int = 64) -> Attachment:
    """Attach the lab to a built ``GRPOTrainer``: per generation, the rollouts as audit records in
    ``records/step-NNNNNN.jsonl`` (None: statistics only) and the ``mismatch/...`` statistics in TRL's
    logs. The trainer's results are unchanged: the wrappers only read what TRL computes.

    ``monitor_every=K`` (0: off): the per-site mismatch monitor at the first generation and then
    every K steps, on a probe of ``monitor_tokens`` tokens of the dataset's prompts, watching
    ``monitor_sites`` in ``monitor_mode`` (minirl's ``monitor_*`` settings, docs/runs.md); its
    readings go to TRL's logs (``mismatch/rel_l2/<site>``, ``mismatch/routing_flips/L<layer>``) and,
    with ``records``, into ``records/metrics.nc`` beside each step's statistics, which
    ``mlab plot RECORDS --sites`` draws. It needs the engine that generated in this process: a
    ``rollout_func(spec)``."""
    if trainer.rollout_func is None and not trainer.use_vllm:
        raise ValueError(_NO_LOGPROBS)
    if monitor_every and not isinstance(trainer.rollout_func, EngineRollouts):
        raise ValueError(f"attach(monitor_every={monitor_every}): the monitor reads the engine that generated, and "
                         "only a rollout_func(spec) engine is in this process for it to read (TRL's own vLLM and "
                         "other rollout functions are not); pass rollout_func=rollout_func('vllm:bfloat16') or "
                         "another engine spec, or monitor_every=0")
    folder = Path(records) if records is not None else None
    monitor = (SiteMonitor(monitor_every, monitor_sites, monitor_mode, folder / "metrics.nc" if folder else None)
               if monitor_every else None)
    att = Attachment(trainer, folder, monitor, monitor_tokens)
    trainer._generate_and_score_completions = _after(trainer._generate_and_score_completions, trainer, att)
    trainer._compute_loss = _capturing_loss(trainer._compute_loss, trainer, att)
    trainer._get_per_token_logps_and_entropies = _captured(trainer._get_per_token_logps_and_entropies, att)
    return att


def _after(generate: Callable, trainer: Any, att: Attachment) -> Callable:
    def wrapped(inputs: list) -> dict:
        out = generate(inputs)
        if trainer.model.training:  # eval batches train nothing; their statistics would mix into train's
            att.after_generation(out)
        return out
    return wrapped


def _capturing_loss(compute_loss: Callable, trainer: Any, att: Attachment) -> Callable:
    """The loss forward's first logprobs call is the policy on this slice; capture it only when TRL
    did not compute ``old_per_token_logps`` (else the statistics were already logged)."""
    def wrapped(model: Any, inputs: dict) -> torch.Tensor:
        wanted = trainer.model.training and "old_per_token_logps" not in inputs
        att._capture = [] if wanted else None
        try:
            loss = compute_loss(model, inputs)
        finally:
            captured, att._capture = att._capture, None
        if captured:
            att.after_loss_forward(captured[0], inputs)
        return loss
    return wrapped


def _captured(logps_and_entropies: Callable, att: Attachment) -> Callable:
    def wrapped(*args: Any, **kwargs: Any) -> tuple:
        out = logps_and_entropies(*args, **kwargs)
        if att._capture is not None and not att._capture:
            att._capture.append(out[0])  # [b, T] per-token logprobs
        return out
    return wrapped


@contextlib.contextmanager
def _own_forward(model: torch.nn.Module) -> Iterator[None]:
    """The model's class ``forward`` while the monitor reads it. TRL's fused LM head
    (``trl.trainer.utils.add_fused_lm_head``) sets an instance ``forward`` that closes over the
    original model's bound ``forward``, so the monitor's float64 copy of the model (its noise floor,
    ``copy.deepcopy``) would run the trainer's model and capture nothing of its own. Without
    ``fused_lm_head=True``, which the monitor never passes, that forward is the class one anyway."""
    patched = model.__dict__.pop("forward", None)
    try:
        yield
    finally:
        if patched is not None:
            model.forward = patched


def sampling_of(trainer: Any) -> dict[str, float]:
    """The sampling settings the run asked for, as records state them (settings at their no-op value
    left out): the audit compares them with what the logprobs show."""
    args = trainer.args
    told = {"temperature": trainer.temperature, "top_p": args.top_p, "top_k": args.top_k, "min_p": args.min_p,
            "repetition_penalty": args.repetition_penalty}
    noop = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
    return {k: float(v) for k, v in told.items() if v is not None and v != noop.get(k)}

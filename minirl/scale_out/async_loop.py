"""The producer-consumer driver behind ``mode: async`` (1-step-off) and ``mode: ray``.

    >>> result = minirl.train({**config, "mode": "async", "max_staleness": 1})

``minirl.train`` calls ``run`` for these modes; ``run`` with ``mode: sync`` is the same schedule in
lockstep (``max_staleness`` taken as 0), which the tests compare the other modes against.

The driver is AsyncFlow's producer-consumer workflow (§4): a producer fills the TransferQueue
(§3) with step j's prompts, rollouts and rewards, sample by sample; the consumer (the learner)
takes step k's samples as soon as they are all there, updates, and publishes the new weights.
With ``max_staleness = s`` the producer may run up to ``s`` steps ahead on the weights it was
given (the *delayed parameter update* of §4.2.2): rollouts of step k+s are generated on the
weights of step k while step k trains, so every trained token is at most ``s`` updates old.
``s = 0`` is the synchronous loop. Each token records the version it was sampled under and
the learner refuses anything older than ``s`` (``minirl.training.learner``).

``sync``/``async`` run in this process (the producer is a thread); ``ray`` runs rollout
engines, reward workers and the trainer as Ray actors (``minirl.scale_out.ray_actors``).
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


from minirl.training.learner import Learner
from minirl.scale_out.pipeline import COLUMNS, LoopResult, admit_prompts, learn_on, queue_config, staleness
from minirl.scale_out.reward_worker import RewardWorker
from minirl.training.lifecycle import Lifecycle
from minirl.scale_out.timeline import Timeline
from minirl.training.train_config import TrainConfig
from minirl.scale_out.transfer_queue import LocalTransferQueue


def run(train: TrainConfig, resume: bool = False, on_dispatch=None, overwrite: bool = True  # noqa: ANN001
        ) -> LoopResult:
    """Train ``train.steps`` steps in ``train.mode`` under the run lifecycle every mode shares
    (``minirl.training.lifecycle``); ``resume`` continues from ``<out_dir>/checkpoint``.
    ``on_dispatch(actor, indices)`` (Ray only) is called as work is handed to a rollout actor: the
    hook fault-injection experiments kill actors from."""
    with Lifecycle.open(train, resume, overwrite) as life:  # locked before any worker starts
        if train.mode == "ray":
            from minirl.scale_out.ray_actors import RayBackend

            backend = RayBackend(train, on_dispatch)
        else:
            backend = LocalBackend(train)
        try:
            return drive(backend, train, life, resume)
        finally:
            backend.close()


def drive(backend, train: TrainConfig, life: Lifecycle, resume: bool) -> LoopResult:  # noqa: ANN001
    """The producer-consumer schedule (§4.2.2), the same for every backend; ``backend`` is the
    lifecycle's ``Policy`` (checkpoints and held-out evaluation, wherever its model lives)."""
    s = staleness(train)
    hist: Counter[int] = Counter()
    first, start = [], time.time()

    def loop(begin: int) -> None:
        first.append(begin)
        backend.publish(begin)
        launched, last = {}, time.time()
        with ThreadPoolExecutor(1, thread_name_prefix="minirl-producer") as producer:
            for k in range(begin, train.steps):
                held_out = {}
                if life.evaluation_due(k):  # on the weights of step k, with no rollout in flight
                    for pending in launched.values():
                        pending.result()
                    held_out = backend.held_out()
                for j in range(k, min(k + s, train.steps - 1) + 1):  # run ahead at most s steps
                    if j not in launched:
                        launched[j] = producer.submit(backend.produce, j, k)  # on the weights of step k
                launched.pop(k).result()
                metrics, step_hist = backend.learn(k)
                hist.update(step_hist)
                metrics["time_sync"] = backend.publish(k + 1)
                now = time.time()
                metrics.update(time_step=now - last, samples_per_s=train.prompts_per_step * train.group_size
                               / (now - last), queue_in_flight=backend.queue.stats()["in_flight"])
                last = now
                if life.monitor_due(k + 1):  # the monitor runs the engine in record: no rollout in flight
                    for pending in launched.values():
                        pending.result()
                life.record(k, {**metrics, **held_out})

    life.run(backend, resume, loop)
    wall = time.time() - start
    done = (train.steps - first[0]) * train.prompts_per_step * train.group_size
    return LoopResult(Path(train.out_dir), life.log.path, life.log.rows, backend.model, backend.timeline,
                      backend.queue.stats(), dict(sorted(hist.items())), wall, done / wall if wall > 0 else 0.0)


class LocalBackend:
    """``sync``/``async`` in one process: the producer thread owns the rollout engine, the
    calling thread owns the learner; weights cross as published state-dict snapshots."""

    def __init__(self, train: TrainConfig) -> None:
        self.train = train
        self.learner = Learner(train, max_staleness=staleness(train))
        self.engine = self.learner.engine
        self.model = self.learner.trainer.master  # fp32 master weights, as a sync run returns
        self.rewards = RewardWorker(self.learner.trainer.task, self.learner.trainer.tokenizer, train.reward_timeout_s)
        self.queue = LocalTransferQueue(queue_config(train))
        self.timeline = Timeline()
        self.weights: dict[int, dict] = {}
        self.engine_version: int | None = None

    def publish(self, version: int) -> float:
        """Snapshot the learner's weights as ``version``; the engine loads it when it next
        starts a step (so loading overlaps training in async mode, §4.2.3)."""
        t = time.perf_counter()
        with self.timeline.span("sync", version):
            self.weights[version] = self.learner.state_dict()
        for v in [v for v in self.weights if v < version - staleness(self.train)]:
            del self.weights[v]
        return time.perf_counter() - t

    def produce(self, step: int, version: int) -> None:
        if self.engine_version != version:
            with self.timeline.span("sync", step):
                self.engine.load_weights(self.weights[version])
            self.engine_version = version
        admit_prompts(self.queue, self.learner.problems(step), step, self.train)
        while got := self.queue.get("rollout", ("prompt",), 1, group=step):
            problem, prompt_ids, params = got[0].data["prompt"]
            with self.timeline.span("rollout", step):
                rollouts = self.engine.generate([prompt_ids], params)
            self.queue.write(got[0].index, "rollouts", (rollouts, version))
            for x in self.queue.get("reward", ("prompt", "rollouts"), 1, group=step):
                with self.timeline.span("reward", step):
                    self.queue.write(x.index, "reward", self.rewards.score(x.data["prompt"][0], x.data["rollouts"][0]))

    def learn(self, step: int) -> tuple[dict, dict[int, int]]:
        samples = self.queue.get("train", COLUMNS, self.train.prompts_per_step, group=step,
                                 timeout=self.train.sample_timeout_s)
        with self.timeline.span("train", step):
            return learn_on(self.learner, step, samples, self.train.prompts_per_step)

    def held_out(self) -> dict[str, float]:
        """Held-out metrics of the latest published weights (the producer is idle)."""
        self.serve_latest()
        return self.learner.trainer.held_out()

    def serve_latest(self) -> None:
        """The engine loads the latest published weights now (the producer is idle): held-out
        evaluation and the mismatch monitor see the learner's policy. Before the first publish it
        already serves them (loaded or restored with the learner)."""
        version = max(self.weights, default=None)
        if version is not None and self.engine_version != version:
            self.engine.load_weights(self.weights[version])
            self.engine_version = version

    def save_checkpoint(self, path: Path, state: dict) -> None:
        self.learner.trainer.save_checkpoint(path, state)

    def load_checkpoint(self, path: Path) -> dict:
        return self.learner.trainer.load_checkpoint(path)

    def resumed(self, step: int) -> None:
        self.learner.trainer.resumed(step)
        self.learner.version = step  # one update per step

    def close(self) -> None:
        pass

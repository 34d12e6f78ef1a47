"""Asynchronous rollouts (``rollout.async``): a step-level sampler runs ahead of the learner
under AReaL's admission rule, and new weights reach it between batches or between two decode
steps.

The sampler side (:class:`_SamplerSide`) is the same on both clocks: at each decode step it
loads newly published weights when it may, submits what :func:`~harness.sampling.admission.capacity`
allows (prompts drawn from the run's prompt stream), advances every running sequence one token
and queues the groups that finished. A training step takes ``prompts_per_step`` groups: the
oldest submitted (waiting for them) or, with partial rollouts, the first finished.

* ``clock: virtual`` (:class:`VirtualRollouts`): one thread. Time is counted in decode steps; a
  step takes its batch at the first decode step where the learner is free and the batch is ready,
  and its update is published ``update_time`` decode steps later. The interleaving depends on
  the config alone, so a run repeats bit for bit.
* ``clock: threads`` (:class:`ThreadedRollouts`): the sampler side runs in its own thread; the
  learner publishes each update as soon as it is made. Every wait is bounded and says what it
  waits for; a sampler error ends the run with its reason; :meth:`close` stops the thread.

Either way a step's batch is a :class:`~harness.run.collect.Collected` like the synchronous
loop's, every token carrying its version and its behaviour log-prob from the moment it was
sampled; the step's ``async/*`` metrics come from :meth:`step_metrics`.
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from harness.model.lora import is_lora
from harness.ppo.actor import roll_left
from harness.run.collect import Collected, Rollouts
from harness.run.dynamic_sampling import Round, concat_rollouts, score_round
from harness.run.mismatch import MismatchProbe, mismatch_probe
from harness.run.policies import frozen_copy
from harness.run.sampler import engine_step_sampler, local_step_sampler
from harness.run.scaffold import Diverged
from harness.sampling import NonFiniteLogits
from harness.sampling.admission import capacity, lag_stats, over_sampled
from harness.sampling.stepping import Finished, StepSampler
from harness.tasks import score_parts

# How long a training step waits for its batch on the threads clock before it gives up.
BATCH_WAIT_S = 900.0
# How long closing waits for the sampler thread to stop.
STOP_WAIT_S = 120.0


def weights_state(model: Any, *, trainable_only: bool) -> dict[str, torch.Tensor]:
    """A detached copy of ``model``'s weights (under LoRA the adapters only)."""
    with torch.no_grad():
        if trainable_only:
            return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        return {n: t.detach().clone() for n, t in model.state_dict().items()}


class _SamplerSide:
    """The sampler's state and its decode step (module docstring), shared by both clocks."""

    def __init__(self, run: Any, stepper: StepSampler, *, trainable_only: bool) -> None:
        cfg = run.cfg
        a = cfg.rollout.asynchronous
        self.cfg, self.task, self.stepper = cfg, run.task, stepper
        self.batch = cfg.rollout.prompts_per_step
        self.eta = a.max_staleness
        self.partial = a.partial
        self.extra = over_sampled(a.over_sample, self.batch) if a.partial else 0
        self.max_concurrent = a.max_concurrent
        self.in_flight = a.weight_updates == "in_flight"
        self.recompute = a.in_flight_kv == "recompute"
        self.trainable_only = trainable_only
        self.rng = random.Random(cfg.seed)  # the prompt stream, as the synchronous loop's
        self.version = 0  # the published version (what admission counts with)
        self.accepted = 0  # groups finished so far
        self.next_gid = 0
        self.taken = 0  # groups consumed so far (submission order without partial)
        self.queue: dict[int, Finished] = {}  # finished, not consumed, in finish order
        self.examples: dict[int, Any] = {}
        self.unloaded: tuple[dict[str, torch.Tensor], int] | None = None  # published, not loaded
        # Published weights by version, for the mismatch probe (pruned as versions age out).
        self.states: dict[int, dict[str, torch.Tensor]] = {}
        self.submitted_at: dict[int, int] = {}
        self.decode_s = 0.0

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.version = version
        self.unloaded = (state, version)
        self.states[version] = state

    def tick(self) -> bool:
        """One decode step of the sampler (load, admit, advance, queue); False when it had
        nothing to run."""
        load, examples, gids = self.plan()
        done, busy = self.advance(load, examples, gids)
        self.finish(done)
        return busy

    # The three parts of a tick: the threads clock runs plan and finish under its lock and the
    # decode step between them outside it (the learner trains meanwhile).
    def plan(self) -> tuple[tuple[dict[str, torch.Tensor], int] | None, list[Any], list[int]]:
        """What this decode step loads and submits (bookkept here, done by :meth:`advance`)."""
        load = None
        if self.unloaded is not None and (self.in_flight or self.stepper.running == 0):
            load, self.unloaded = self.unloaded, None
        n = 0
        if self.unloaded is None:  # between batches: no new group until the weights are in
            n = capacity(
                accepted=self.accepted,
                running=self.stepper.running,
                version=self.version,
                max_staleness=self.eta,
                batch=self.batch,
                extra=self.extra,
                max_concurrent=self.max_concurrent,
            )
        examples = self.task.sample(self.rng, n) if n else []
        gids = list(range(self.next_gid, self.next_gid + n))
        self.next_gid += n
        version = load[1] if load is not None else self.stepper.version
        for g, e in zip(gids, examples, strict=True):
            self.examples[g] = e
            self.submitted_at[g] = version
        return load, examples, gids

    def advance(
        self,
        load: tuple[dict[str, torch.Tensor], int] | None,
        examples: list[Any],
        gids: list[int],
    ) -> tuple[list[Finished], bool]:
        """Load, submit and run one decode step; the groups finished and whether any ran."""
        if load is not None:
            self.stepper.load(load[0], load[1], recompute=self.recompute)
        if examples:
            self.stepper.submit([e.prompt for e in examples], gids)
        if self.stepper.running == 0:
            return [], False
        t0 = time.perf_counter()
        done = self.stepper.step()
        self.decode_s += time.perf_counter() - t0
        return done, True

    def finish(self, done: list[Finished]) -> None:
        for f in done:
            self.queue[f.gid] = f
        self.accepted += len(done)

    def ready(self) -> bool:
        if self.partial:
            return len(self.queue) >= self.batch
        return all(g in self.queue for g in range(self.taken, self.taken + self.batch))

    def take(self) -> tuple[list[Finished], list[Any]]:
        """The step's groups (the oldest submitted, or the first finished with partial)."""
        if self.partial:
            gids = list(self.queue)[: self.batch]
        else:
            gids = list(range(self.taken, self.taken + self.batch))
        self.taken += self.batch
        groups = [self.queue.pop(g) for g in gids]
        examples = [self.examples.pop(g) for g in gids]
        for g in gids:
            self.submitted_at.pop(g)
        return groups, examples

    def prune(self, learner_version: int) -> None:
        """Forget the published weights no queued or running token can have come from."""
        oldest = min(self.submitted_at.values(), default=learner_version)
        for v in [v for v in self.states if v < min(oldest, self.version)]:
            del self.states[v]


class AsyncRollouts:
    """What the training loop sees of asynchronous rollouts: :meth:`collect` a step's batch,
    :meth:`updated` after its update, :meth:`step_metrics`, :meth:`close`."""

    def __init__(
        self,
        run: Any,
        stepper: StepSampler,
        probe: MismatchProbe,
        *,
        trainable_only: bool,
        probe_model: Callable[[], Any],
    ) -> None:
        self.run, self.cfg, self.device = run, run.cfg, run.device
        self.side = _SamplerSide(run, stepper, trainable_only=trainable_only)
        self.probe, self.probe_model = probe, probe_model
        self.trainable_only = trainable_only
        pad = run.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else 0
        self.sampler_idle_s = 0.0
        self.learner_idle_s = 0.0
        self.last_lags: dict[str, float] = {}
        self.lag_counts: dict[int, int] = {}

    def start(self, model: Any) -> None:
        """Load the start weights (version 0) into the sampler."""
        self.side.publish(weights_state(model, trainable_only=self.trainable_only), 0)

    def collect(self, policies: Any, step: int) -> Collected:
        """The step's batch (``policies.version``: the updates the learner has made)."""
        return self._collect(step, policies.version)

    def _collect(self, step: int, learner_version: int) -> Collected:
        raise NotImplementedError

    def updated(self, model: Any, version: int) -> None:
        """Hand the learner's new weights (``version``) over to the sampler."""
        raise NotImplementedError

    def close(self) -> None:
        self.side.stepper.close()

    # ---- shared
    def _collected(
        self, step: int, groups: list[Finished], examples: list[Any], learner_version: int
    ) -> Collected:
        cfg = self.cfg
        rb = concat_rollouts([g.rb for g in groups], self.pad_id)
        if not torch.isfinite(rb.logprobs).all():
            raise Diverged(step, "non-finite behaviour log-probs in the rollout")
        per_row = [e for e in examples for _ in range(cfg.rollout.n_samples)]
        parts = [score_parts(self.task, e, c) for e, c in zip(per_row, rb.completions, strict=True)]
        first = score_round(
            Round(rb, per_row, parts), cfg.ppo, cfg.rollout.max_new_tokens, self.device
        )
        assert rb.versions is not None
        gen = rb.loss_mask.bool()
        oldest = int(rb.versions[gen].min()) if bool(gen.any()) else learner_version
        self.last_lags = lag_stats(rb.versions, rb.loss_mask, learner_version)
        lags = (learner_version - rb.versions[gen]).tolist()
        for lag in lags:
            self.lag_counts[lag] = self.lag_counts.get(lag, 0) + 1
        # The lag distribution the run actually got (on the threads clock, whatever the
        # timing gave): the share of generated tokens at each lag, in the run's tags.
        total = sum(self.lag_counts.values())
        self.run.tags["async.token_lags"] = ", ".join(
            f"{k}: {100 * n / total:.1f}%" for k, n in sorted(self.lag_counts.items())
        )
        snapshot = self._snapshot(rb, learner_version)
        return Collected(first, None, snapshot, oldest)

    @property
    def task(self) -> Any:
        return self.side.task

    def _snapshot(self, rb: Any, learner_version: int) -> torch.Tensor | None:
        """ℓsnap for the mismatch probe: each token's log-prob under the learner-precision
        forward of the weights that sampled it (None when every token is the current version,
        where ℓsnap is ℓcur)."""
        if not self.probe.enabled:
            return None
        gen = rb.loss_mask.bool()
        used = sorted({int(v) for v in rb.versions[gen].unique().tolist()})
        if used == [learner_version] or not used:
            return None
        module = self.probe_model()
        versions_p = roll_left(rb.versions)
        snap: torch.Tensor | None = None
        for v in used:
            state = self.side.states.get(v)
            if state is None:  # the live weights (a token of the current version)
                continue
            with torch.no_grad():
                own = module.state_dict()
                for name, value in state.items():
                    own[name].copy_(value)
            lp = self.probe.learner_logprobs(module, rb)
            snap = lp if snap is None else torch.where(versions_p == v, lp, snap)
        return snap

    def step_metrics(self) -> dict[str, float]:
        out = {
            **self.last_lags,
            "async/sampler_idle_s": self.sampler_idle_s,
            "async/learner_idle_s": self.learner_idle_s,
        }
        self.sampler_idle_s = self.learner_idle_s = 0.0
        return out


def _sampling_error(step: int, err: BaseException) -> BaseException:
    if isinstance(err, NonFiniteLogits):
        return Diverged(step, f"non-finite probabilities while sampling ({err})")
    return err


class VirtualRollouts(AsyncRollouts):
    """The virtual clock (module docstring): one thread, time in decode steps."""

    def __init__(self, *args: Any, update_time: int, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.update_time = update_time
        self.t = 0  # the decode step the sampler is at
        self.publish_at: int | None = None
        self.pending: tuple[dict[str, torch.Tensor], int] | None = None
        self.mid_tick = False  # a batch was taken at the start of tick t: resume with its rest
        self.idle_ticks = {"sampler": 0, "learner": 0}

    def _collect(self, step: int, learner_version: int) -> Collected:
        side = self.side
        while True:
            if not self.mid_tick:
                if self.publish_at is not None and self.t >= self.publish_at:
                    assert self.pending is not None
                    side.publish(*self.pending)
                    self.pending = self.publish_at = None
                if self.publish_at is None:  # the learner is free
                    if side.ready():
                        self.mid_tick = True
                        groups, examples = side.take()
                        self.t_take = self.t
                        self._idle_seconds()
                        out = self._collected(step, groups, examples, learner_version)
                        side.prune(learner_version)
                        return out
                    self.idle_ticks["learner"] += 1
            self.mid_tick = False
            try:
                busy = side.tick()
            except Exception as err:
                raise _sampling_error(step, err) from None
            if not busy:
                self.idle_ticks["sampler"] += 1
                if self.publish_at is None and not side.ready():
                    raise RuntimeError(
                        "asynchronous rollouts: nothing running, nothing to admit and no update "
                        "pending (the admission rule admits no group)"
                    )
                if self.publish_at is not None and side.stepper.running == 0:
                    # Nothing can happen before the update lands: jump there.
                    self.idle_ticks["sampler"] += max(self.publish_at - self.t - 1, 0)
                    self.t = self.publish_at
                    continue
            self.t += 1

    def updated(self, model: Any, version: int) -> None:
        self.pending = (weights_state(model, trainable_only=self.trainable_only), version)
        self.publish_at = self.t_take + self.update_time

    def _idle_seconds(self) -> None:
        """The idle decode steps since the last batch, at the measured seconds per decode
        step (the virtual clock's idle time, as it would be in real overlap)."""
        steps = max(self.side.stepper.decode_steps, 1)
        per_step = self.side.decode_s / steps
        self.sampler_idle_s = self.idle_ticks["sampler"] * per_step
        self.learner_idle_s = self.idle_ticks["learner"] * per_step
        self.idle_ticks = {"sampler": 0, "learner": 0}


class ThreadedRollouts(AsyncRollouts):
    """The threads clock (module docstring): the sampler side in its own thread.

    The learner (the run's thread) and the sampler share one lock and hold it only to bookkeep,
    never across a blocking call: the sampler to plan a decode step (load, admit, draw the
    prompts) and queue what finished, the learner to take a batch, publish weights and forget
    old ones; the decode step and the training step run outside it. So taking the lock is not
    one of the waits bounded below, and it is taken with ``with``, which Ctrl-C cannot split
    from its release (a timed acquire written out in Python can leave it held when the signal
    lands between the acquire and its ``try``). The learner's waits for the other side are
    bounded and each message names what it waited for: the step's batch (``BATCH_WAIT_S``) and
    the thread's end (``STOP_WAIT_S``). The sampler waits only while it has nothing to run, in
    1 s slices that look at the stop flag, which :meth:`close` sets whatever ends the run (the
    loop closes its rollouts in a ``finally``). A sampler error ends the run at the learner's
    next batch: non-finite logits as a divergence, anything else as an error naming the sampler
    thread."""

    THREAD_NAME = "harness-async-sampler"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.cond = threading.Condition()
        self.stop = False
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self._sampler_idle = 0.0

    def start(self, model: Any) -> None:
        super().start(model)
        self.thread = threading.Thread(target=self._loop, name=self.THREAD_NAME, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        side = self.side
        try:
            while True:
                with self.cond:
                    if self.stop:
                        return
                    load, examples, gids = side.plan()
                    if load is None and not examples and side.stepper.running == 0:
                        # Idle until a take, a publish or the stop; no bound of its own: the
                        # learner's waits are bounded and every end of the run sets the stop.
                        t0 = time.perf_counter()
                        self.cond.wait(timeout=1.0)
                        self._sampler_idle += time.perf_counter() - t0
                        continue
                done, _ = side.advance(load, examples, gids)  # outside the lock
                with self.cond:
                    side.finish(done)
                    self.cond.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the learner, which raises it
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def _failure(self, step: int, err: BaseException) -> BaseException:
        """What the run raises for the sampler thread's ``err``: a divergence for non-finite
        logits (as the synchronous loop), else a RuntimeError naming the sampler thread with
        ``err`` as its cause (a one-line reason on the console and in the tracker, whatever
        ``err``'s type); an exit (``SystemExit``) stays itself."""
        failure = _sampling_error(step, err)
        if failure is not err or not isinstance(err, Exception):
            return failure
        lines = str(err).strip().splitlines()
        wrapped = RuntimeError(
            f"asynchronous rollouts: the sampler thread failed (step {step} was waiting for its "
            f"batch): {type(err).__name__}: {lines[0] if lines else ''}"
        )
        wrapped.__cause__ = err
        return wrapped

    def _collect(self, step: int, learner_version: int) -> Collected:
        side = self.side
        t0 = time.perf_counter()
        deadline = t0 + BATCH_WAIT_S
        with self.cond:
            # A failed sampler ends the run at once, even with batches it queued before.
            while self.error is None and not side.ready():
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise RuntimeError(
                        f"asynchronous rollouts: waited {BATCH_WAIT_S:.0f} s for the sampler "
                        f"thread to finish step {step}'s {side.batch} groups (have "
                        f"{len(side.queue)} finished, {side.stepper.running} running)"
                    )
                self.cond.wait(timeout=min(left, 1.0))
            if self.error is not None:
                raise self._failure(step, self.error)
            groups, examples = side.take()
            self.learner_idle_s = time.perf_counter() - t0
            self.sampler_idle_s, self._sampler_idle = self._sampler_idle, 0.0
        out = self._collected(step, groups, examples, learner_version)
        with self.cond:
            side.prune(learner_version)
        return out

    def updated(self, model: Any, version: int) -> None:
        state = weights_state(model, trainable_only=self.trainable_only)
        with self.cond:
            self.side.publish(state, version)
            self.cond.notify_all()

    def close(self) -> None:
        """Stop the sampler thread and wait for it to end (``STOP_WAIT_S`` at most, the decode
        step it is in), then release the stepper. A thread still running then fails the run
        naming the wait; where the run is already ending in an error (this is the loop's
        ``finally``), that error stays the run's reason and the wait is noted on it. The stepper
        is released either way: an engine must not outlive its run because its thread is stuck
        (the stuck step then fails in the thread, which ends with it)."""
        self.stop = True  # read by the sampler before each decode step
        thread = self.thread
        if thread is not None:
            with self.cond:
                self.cond.notify_all()  # an idle sampler ends now, not after its 1 s slice
            thread.join(timeout=STOP_WAIT_S)
            if thread.is_alive():
                msg = (
                    f"asynchronous rollouts: the sampler thread did not stop within "
                    f"{STOP_WAIT_S:.0f} s of the end of the run"
                )
                ending = sys.exc_info()[1]
                try:
                    super().close()
                except Exception as err:  # noqa: BLE001 - the stuck thread is the news
                    msg += f"; releasing its sampler failed too ({type(err).__name__}: {err})"
                if ending is not None:
                    ending.add_note(msg)
                    return
                raise RuntimeError(msg)
            self.thread = None
        super().close()


def open_rollouts(run: Any, sampler: Any, amp: torch.dtype | None) -> Any:
    """The run's rollouts: :class:`~harness.run.collect.Rollouts` (synchronous, or the strict
    fixed lag of ``rollout.staleness``) or, under ``rollout.async``, the clock's asynchronous
    rollouts over a step-level sampler: the engine's for ``rollout.sampler_backend: vllm``, else
    a step-level copy of the local sampler."""
    cfg = run.cfg
    a = cfg.rollout.asynchronous
    if not a.enabled:
        return Rollouts(run, sampler, amp)
    lora = is_lora(run.model)
    if cfg.rollout.sampler_backend == "vllm":
        # Its weight copies are reported as the run sampler's (perf/weight_sync_s).
        stepper: StepSampler = engine_step_sampler(run, amp, on_sync=sampler.count_sync)
    else:
        stepper = local_step_sampler(run, amp)
    copies: list[Any] = []

    def probe_model() -> Any:
        if not copies:
            copies.append(frozen_copy(run.model))
        return copies[0]

    kw = dict(trainable_only=lora, probe_model=probe_model)
    probe = mismatch_probe(cfg, run.device, amp)
    if a.clock == "threads":
        rollouts: AsyncRollouts = ThreadedRollouts(run, stepper, probe, **kw)
    else:
        update_time = a.update_time or max(cfg.rollout.max_new_tokens // 2, 1)
        rollouts = VirtualRollouts(run, stepper, probe, update_time=update_time, **kw)
    rollouts.start(run.model)
    return rollouts

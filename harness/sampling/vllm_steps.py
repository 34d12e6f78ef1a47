"""The vLLM engine, step by step: :class:`EngineStepSampler` drives the in-process engine
(:class:`harness.sampling.vllm.EngineHost`) one engine step at a time for asynchronous rollouts
(:mod:`harness.sampling.stepping`), through vLLM's own step-level API: ``add_request`` per row,
``step()`` (every running request advances by one token), ``abort_request``.

* **Rows.** A group is ``n_samples`` requests, one per row, each with its own seed drawn from the
  run's sampling generator when it is submitted (as the batch engine sampler draws them), so a
  row's stream does not depend on what else runs beside it and the virtual clock's schedule
  repeats. Each step's new token comes with its processed log-prob, ``log_softmax(logits / T)``
  (the local sampler's ℓb, the learner's meaning), and the version loaded at that step.
* **New weights** (:meth:`EngineStepSampler.load`) go in between two steps with vLLM's in-place
  ``reload_weights`` (under LoRA the adapters merged into the base weights, as the batch sampler
  syncs). With ``keep`` that is all: the running requests continue over the KV cache the old
  weights computed. With ``recompute`` every running request is aborted and resubmitted as its
  prompt + the tokens it generated so far, with the tokens left to generate and a seed derived
  from its own (:func:`resubmit_seed`), so the whole KV is recomputed under the new weights
  (AReaL's interruptible generation); the tokens already sampled keep their ℓb and versions.
* **Finished groups** are assembled as the local step sampler assembles them: token layout
  (:func:`~harness.sampling.base.assemble_batch`), each group's prompts left-padded as they were
  encoded together at submission, versions −1 off the generated tokens.

The engine starts at the first :meth:`~EngineStepSampler.load` (on those weights) and ends with
:meth:`~EngineStepSampler.close`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.sampling.base import RolloutBatch
from harness.sampling.stepping import Finished, PolicyStepSampler, StepSetup
from harness.sampling.vllm import EngineHost, engine_batch, padded, request_params
from harness.sampling.vllm_host import ENGINE_LOCK, EngineError

# Seeds are drawn below vLLM's bound (a signed 32-bit value).
SEED_BOUND = 2**31 - 1


def resubmit_seed(seed: int, times: int) -> int:
    """The seed of a row's ``times``-th resubmission (``times`` ≥ 1) from its first seed: a fixed
    function of the two, so a recomputed row's new stream depends on nothing else the run does
    (the run's sampling generator is not drawn from). A Weyl step by the golden-ratio constant
    keeps the seeds of successive resubmissions apart."""
    return (seed + times * 0x9E3779B1) % SEED_BOUND


@dataclass(eq=False)
class _Row:
    """One request's row: its prompt (unpadded), what it generated, with the ℓb and the version
    of each token, and the request it runs as now."""

    group: _Group
    prompt: list[int]
    seed: int
    tokens: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    request: str = ""
    resubmits: int = 0
    stepped: bool = False  # an engine step ran since the request was added (its KV exists)
    done: bool = False


@dataclass(eq=False)
class _Group:
    gid: int
    submitted: int
    prompt_ids: torch.Tensor  # [n, P], left-padded as encoded with the prompts submitted with it
    prompt_mask: torch.Tensor
    rows: list[_Row] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return all(r.done for r in self.rows)


class EngineStepSampler(PolicyStepSampler):
    """Step-level sampling with the vLLM engine (module docstring). ``setup.model`` is the
    sampler's own copy of the policy (the weights :meth:`load` copies in, merged for the engine
    under LoRA), ``setup.generator`` draws the rows' seeds; ``host`` is the engine, not started;
    ``on_sync`` is told the seconds of each weight copy."""

    def __init__(
        self,
        setup: StepSetup,
        *,
        host: EngineHost,
        on_sync: Callable[[float], None] | None = None,
    ) -> None:
        # RolloutConfig refuses it; a direct caller gets the same answer.
        if setup.params.top_p < 1.0:
            raise ValueError("rollout.top_p: must be 1 with sampler_backend vllm")
        super().__init__(setup)
        self.host = host
        self.on_sync = on_sync
        self.groups: list[_Group] = []  # submitted, not handed back, in submission order
        self.requests: dict[str, _Row] = {}  # running request id -> its row
        self.sync_seconds = 0.0
        self.resubmitted = 0  # requests aborted and resubmitted by recompute loads
        self._count = 0  # request ids issued (unique for the engine's life)

    @property
    def running(self) -> int:
        return len(self.groups)

    @property
    def device(self) -> torch.device:
        return self.host.device

    # ---- weights
    def load(self, state: dict[str, torch.Tensor], version: int, *, recompute: bool) -> None:
        with torch.no_grad():
            own = self.model.state_dict()
            for name, value in state.items():
                own[name].copy_(value)
        seconds = self.host.sync(self.model)  # the first load starts the engine (not counted)
        self.sync_seconds += seconds
        if self.on_sync is not None:
            self.on_sync(seconds)
        self.version = version
        self.loads += 1
        if recompute:
            self._resubmit([r for r in self.requests.values() if r.stepped])

    def _resubmit(self, rows: list[_Row]) -> None:
        """Abort ``rows``' requests and add each again as prompt + generated prefix, for the
        tokens it has left, under a derived seed (module docstring)."""
        if not rows:
            return
        engine = self._engine()
        ids = [r.request for r in rows]
        self._call(engine.abort_request, ids, what="abort")
        for rid in ids:
            del self.requests[rid]
        for r in rows:
            r.resubmits += 1
            self._add(r, r.prompt + r.tokens, resubmit_seed(r.seed, r.resubmits))
        self.resubmitted += len(rows)

    # ---- sampling
    def submit(self, prompts: list[str], gids: list[int]) -> None:
        if not prompts:
            return
        if self.host.llm is None:
            raise RuntimeError("engine step sampler: submit before the first load")
        p = self.params
        ids, mask, eos, pad_id = self.encode(prompts)
        ids, mask = ids.cpu(), mask.cpu()
        self.eos, self.pad_id = eos.cpu(), pad_id
        # Per-row seeds from the run's sampling generator, as the batch engine sampler draws them.
        seeds = torch.randint(
            0, SEED_BOUND, (ids.shape[0],), generator=self.generator, device=self.generator.device
        ).tolist()
        n = p.n_samples
        for i, gid in enumerate(gids):
            rows = slice(i * n, (i + 1) * n)
            g = _Group(gid, self.version, ids[rows], mask[rows])
            for j in range(i * n, (i + 1) * n):
                prompt = [
                    int(t) for t, m in zip(ids[j].tolist(), mask[j].tolist(), strict=True) if m
                ]
                row = _Row(g, prompt, int(seeds[j]))
                g.rows.append(row)
                self._add(row, prompt, row.seed)
            self.groups.append(g)

    def _add(self, row: _Row, prompt: list[int], seed: int) -> None:
        assert self.eos is not None
        p = self.params
        rid = f"r{self._count}"
        self._count += 1
        params = request_params(
            max_tokens=p.max_new_tokens - len(row.tokens),
            temperature=0.0 if p.greedy else p.temperature,  # vLLM's greedy is temperature 0
            seed=seed,
            eos_token_ids=[int(t) for t in self.eos.tolist()],
            delta=True,
        )
        self._call(
            self._engine().add_request, rid, {"prompt_token_ids": prompt}, params, what="submit"
        )
        row.request, row.stepped = rid, False
        self.requests[rid] = row

    def step(self) -> list[Finished]:
        if not self.requests:
            return []
        engine = self._engine()
        with self.host.eager():
            outs = self._call(engine.step, what="step")
        for running in self.requests.values():
            running.stepped = True
        for out in outs:
            row = self.requests.get(out.request_id)
            if row is None:  # an aborted request's last output
                continue
            comp = out.outputs[0]
            toks = [int(t) for t in comp.token_ids]
            row.tokens += toks
            row.logps += [
                float(d[t].logprob) for t, d in zip(toks, comp.logprobs or [], strict=True)
            ]
            row.versions += [self.version] * len(toks)
            if out.finished:
                row.done = True
                del self.requests[out.request_id]
        self.decode_steps += 1
        out_groups = [g for g in self.groups if g.done]
        self.groups = [g for g in self.groups if not g.done]
        return sorted(
            (Finished(g.gid, self._assemble(g), g.submitted) for g in out_groups),
            key=lambda f: f.gid,
        )

    def _assemble(self, g: _Group) -> RolloutBatch:
        """The group's rows in token layout, as the local step sampler assembles a group."""
        assert self.eos is not None
        rows = [(r.tokens, r.logps) for r in g.rows]
        rb = engine_batch(
            self.tokenizer, g.prompt_ids, g.prompt_mask, rows, self.eos, self.pad_id, [len(rows)]
        )
        gen_versions = padded([r.versions for r in g.rows], -1, torch.long)
        p_width = g.prompt_ids.shape[1]
        versions = torch.full_like(rb.input_ids, -1)
        versions[:, p_width:] = torch.where(rb.loss_mask[:, p_width:].bool(), gen_versions, -1)
        rb.versions = versions
        return rb.to(self.device) if self.device.type != "cpu" else rb

    # ---- the engine
    def _engine(self) -> Any:
        if self.host.llm is None:
            raise RuntimeError("engine step sampler: the engine is not running")
        return self.host.llm.llm_engine

    @staticmethod
    def _call(fn: Any, *args: Any, what: str) -> Any:
        try:
            with ENGINE_LOCK:  # one engine computes at a time in this process (vllm_host)
                return fn(*args)
        except Exception as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise EngineError(f"engine {what} failed: {type(err).__name__}: {first}") from err

    def close(self) -> None:
        """Abort what runs and end the engine (idempotent)."""
        self.groups, self.requests = [], {}
        self.host.close()


__all__ = ["EngineStepSampler", "resubmit_seed"]

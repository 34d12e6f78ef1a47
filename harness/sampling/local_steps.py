"""The local backend, step by step: :class:`LocalStepSampler` drives the local decoders
(:mod:`harness.sampling.decoders`) one decode step at a time for asynchronous rollouts
(:mod:`harness.sampling.stepping`).

Groups submitted together form a *cohort*, decoded as one batch exactly as
:func:`harness.sampling.local.sample` decodes a call: one prefill, then one step per token, one
draw from the sampling generator per step for all the cohort's rows. So a cohort of every prompt
of a step, under one version, samples the same tokens as the synchronous sampler (a test checks
it). A cohort keeps stepping until all its rows are done; each group is handed back the step its
last row ends. Several cohorts run side by side, each its own batch.

Weights live in the stepper's own copy of the policy (``model``), loaded in place by
:meth:`LocalStepSampler.load`: with ``keep`` the cohorts go on with the KV cache the old weights
computed (the fast decoder re-reads the weights it joins), with ``recompute`` each running
cohort is re-prefilled over its prompt and generated prefix under the new weights.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.model.build import precision
from harness.model.logprobs import position_ids
from harness.sampling.base import RolloutBatch, assemble_batch
from harness.sampling.decoders import _fast_path_ok, _HFDecoder, _LlamaDecoder
from harness.sampling.local import LocalSpec, draw_token
from harness.sampling.stepping import Finished, PolicyStepSampler, StepSetup


class _Cohort:
    """Groups submitted at one step, decoded as one batch (module docstring)."""

    def __init__(
        self,
        gids: list[int],
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        n: int,
        max_new_tokens: int,
        pad_id: int,
        submitted: int,
    ) -> None:
        self.gids, self.n, self.submitted = gids, n, submitted
        self.prompt_ids, self.prompt_mask = prompt_ids, prompt_mask
        rows, device = prompt_ids.shape[0], prompt_ids.device
        self.max_new = max_new_tokens
        self.tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
        self.logps = torch.zeros(rows, max_new_tokens, dtype=torch.float32, device=device)
        self.versions = torch.full((rows, max_new_tokens), -1, dtype=torch.long, device=device)
        self.alive = torch.ones(rows, dtype=torch.bool, device=device)
        self.t = 0  # tokens generated so far
        self.decoder: Any = None
        self.offset = 0  # generated tokens inside the decoder's prompt (after a re-prefill)
        self.next_pos: torch.Tensor | None = None
        self.logits: torch.Tensor | None = None
        self.open = set(range(len(gids)))  # groups not yet handed back

    @property
    def done(self) -> bool:
        return not self.open


class LocalStepSampler(PolicyStepSampler):
    """Step-level sampling of ``setup.model`` (the stepper's own copy of the policy; module
    docstring) as the local sampler's ``spec`` says (autocast dtype, decoder, logit noise from
    its own seeded stream)."""

    def __init__(
        self, setup: StepSetup, *, device: torch.device, spec: LocalSpec = LocalSpec()
    ) -> None:
        super().__init__(setup)
        self.device, self.spec = device, spec
        self.fast = spec.decoder != "hf" and _fast_path_ok(self.model)
        if spec.decoder == "fast" and not self.fast:
            raise ValueError(f"sampler: no fast decoder for {type(self.model).__name__}")
        self.noise_generator = spec.noise_stream(device)
        self.cohorts: list[_Cohort] = []

    @property
    def running(self) -> int:
        return sum(len(c.open) for c in self.cohorts)

    def load(self, state: dict[str, torch.Tensor], version: int, *, recompute: bool) -> None:
        with torch.no_grad():
            own = self.model.state_dict()
            for name, value in state.items():
                own[name].copy_(value)
        self.version = version
        self.loads += 1
        with torch.inference_mode(), precision(self.device, self.spec.dtype):
            for c in self.cohorts:
                if c.decoder is None:
                    continue  # not prefilled yet: its prefill sees the new weights
                if recompute:
                    self._prefill(c, reprefill=True)
                else:
                    c.decoder.refresh()

    def submit(self, prompts: list[str], gids: list[int]) -> None:
        if not prompts:
            return
        p = self.params
        ids, mask, eos, pad_id = self.encode(prompts)
        self.eos, self.pad_id = eos, pad_id
        self.cohorts.append(
            _Cohort(gids, ids, mask, p.n_samples, p.max_new_tokens, pad_id, self.version)
        )

    def step(self) -> list[Finished]:
        if not self.cohorts:
            return []
        with torch.inference_mode(), precision(self.device, self.spec.dtype):
            for c in self.cohorts:
                self._advance(c)
        self.decode_steps += 1
        # Assembled outside inference mode: the batch's tensors are ordinary tensors.
        out = [f for c in self.cohorts for f in self._finished(c)]
        self.cohorts = [c for c in self.cohorts if not c.done and bool(c.alive.any())]
        return sorted(out, key=lambda f: f.gid)

    # ---- one cohort
    def _prefill(self, c: _Cohort, *, reprefill: bool = False) -> None:
        """Prefill ``c`` (its prompt; with ``reprefill`` its prompt and generated prefix) under
        the loaded weights; its next logits are the next token's."""
        if reprefill:
            gen_mask = self._gen_mask(c)[:, : c.t]
            ids = torch.cat([c.prompt_ids, c.tokens[:, : c.t]], dim=1)
            mask = torch.cat([c.prompt_mask, gen_mask], dim=1)
            c.offset = c.t
        else:
            ids, mask = c.prompt_ids, c.prompt_mask
        remaining = c.max_new - c.offset
        cls = _LlamaDecoder if self.fast else _HFDecoder
        c.decoder = cls(self.model, mask, remaining)
        pos = position_ids(mask)
        c.logits = c.decoder.prefill(ids, pos)
        c.next_pos = pos[:, -1:] + 1

    def _advance(self, c: _Cohort) -> None:
        if c.t >= c.max_new or not bool(c.alive.any()):
            return
        if c.decoder is None:
            self._prefill(c)
        elif c.logits is None:
            assert c.next_pos is not None
            fed = c.t - 1  # the last sampled token goes in
            c.logits = c.decoder.step(c.tokens[:, fed : fed + 1], c.next_pos, fed - c.offset)
            c.next_pos = c.next_pos + 1
        p = self.params
        assert c.logits is not None
        tok, lp = draw_token(
            c.logits,
            c.t,
            generator=self.generator,
            inv_t=1.0 / p.temperature,
            top_p=p.top_p,
            greedy=p.greedy,
            logit_noise=self.spec.logit_noise,
            noise_generator=self.noise_generator,
        )
        c.logits = None
        assert self.eos is not None
        c.tokens[:, c.t] = torch.where(c.alive, tok, self.pad_id)
        c.logps[:, c.t] = torch.where(c.alive, lp, 0.0)
        c.versions[:, c.t] = torch.where(c.alive, self.version, -1)
        c.alive &= ~torch.isin(tok, self.eos)
        c.t += 1

    def _gen_mask(self, c: _Cohort) -> torch.Tensor:
        """1 on each row's generated tokens up to and including its EOS (assemble_batch's)."""
        assert self.eos is not None
        is_eos = torch.isin(c.tokens, self.eos)
        after = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
        return (~after).to(c.prompt_mask.dtype)

    def _finished(self, c: _Cohort) -> list[Finished]:
        """The groups of ``c`` whose rows are all done after this step (every group once the
        cohort reached max_new_tokens), assembled in token layout."""
        out = []
        n = c.n
        for g in sorted(c.open):
            rows = slice(g * n, (g + 1) * n)
            if c.t < c.max_new and bool(c.alive[rows].any()):
                continue
            c.open.discard(g)
            out.append(Finished(c.gids[g], self._assemble(c, rows), c.submitted))
        return out

    def _assemble(self, c: _Cohort, rows: slice) -> RolloutBatch:
        assert self.eos is not None
        t = c.t
        rb = assemble_batch(
            self.tokenizer,
            c.prompt_ids[rows],
            c.prompt_mask[rows],
            c.tokens[rows, :t].clone(),
            c.logps[rows, :t].clone(),
            self.eos,
            group_sizes=[c.n],
        )
        width = c.prompt_ids.shape[1]
        versions = torch.full_like(rb.input_ids, -1)
        versions[:, width:] = torch.where(rb.loss_mask[:, width:].bool(), c.versions[rows, :t], -1)
        rb.versions = versions
        return rb


__all__ = ["LocalStepSampler"]

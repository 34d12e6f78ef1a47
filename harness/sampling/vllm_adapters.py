"""One vLLM engine serving the LoRA adapters of several runs: the engine of a pack
(``harness/run/packing.py``), where K runs train their own adapter on one frozen base.

Unpacked, the engine sampler (:class:`~harness.sampling.vllm.EngineSampler`) serves a LoRA run
by merging the adapter into the base weights and copying them in after every update. A pack
cannot: its K runs sample K different policies from one base. Here the engine holds the base
weights alone and applies the adapters itself (vLLM's multi-LoRA: ``enable_lora``, one
``LoRARequest`` per adapter), so one engine start serves the whole pack:

* :class:`AdapterEngine`: the pack's one :class:`~harness.sampling.vllm.EngineHost`, started with
  ``max_loras`` = K at the first weight load of any run (on the base weights, none merged), ended
  once by the pack. A start that failed is not retried: every later load gets its reason.
* :class:`AdapterSampler`: one run's view of it, a :class:`~harness.sampling.base.Sampler` like
  the engine sampler (same prompts in, same batch out, same row seeds, same meaning of ℓb) whose
  rows are all sampled under its own adapter. Loading a new version writes the run's active
  adapter (``peft``'s saved layout) to a directory of its own, registers it under a new adapter
  id (vLLM caches adapters by id, so an updated adapter under an old id would be served stale)
  and removes the previous version from the engine: a run holds one adapter slot at a time, so
  K slots serve a pack of K however many updates it makes. Closing the view frees its slot and
  leaves the engine to the pack.

Numerics: the engine computes ``x·W + s·(x·A)·B`` where the merged path computes
``x·(W + s·B·A)``; at float32 the two agree to rounding (about 1e-7 on a log-prob), not bit for
bit, so a packed engine run matches its unpacked engine run to that rounding, not exactly
(tests/run/test_packing_engine.py measures it).
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import torch

from harness.sampling.vllm import EngineHost, EngineSampler
from harness.sampling.vllm_host import ENGINE_LOCK, EngineError


class AdapterEngine:
    """The engine a pack shares (module docstring). ``on_start`` is called right after the
    engine started, ``on_join`` at the first load of a view that found it already running: a
    pack uses them to give every run the process state an engine start leaves (vLLM reseeds the
    process's random generators when it starts), as the run's own engine start would have."""

    def __init__(
        self,
        host: EngineHost,
        *,
        on_start: Callable[[], None] | None = None,
        on_join: Callable[[], None] | None = None,
    ) -> None:
        if host.spec.max_loras < 1:
            raise ValueError("AdapterEngine: the host must serve adapters (max_loras >= 1)")
        self.host = host
        self.on_start, self.on_join = on_start, on_join
        self.starts = 0  # engine starts tried (one per pack)
        self.failure: EngineError | None = None
        self._ids = itertools.count(1)

    @property
    def llm(self) -> Any:
        return self.host.llm

    def ensure_started(self, model: Any) -> bool:
        """Start the engine on ``model``'s base weights unless it runs; whether this call
        started it. A failed start is remembered: later calls raise its reason again."""
        if self.host.llm is not None:
            return False
        if self.failure is not None:
            raise EngineError(str(self.failure))
        self.starts += 1
        try:
            self.host.start(model)
        except EngineError as err:
            self.failure = err
            raise
        if self.on_start is not None:
            self.on_start()
        return True

    def new_id(self) -> int:
        """An adapter id never used on this engine (ids start at 1)."""
        return next(self._ids)

    def add(self, request: Any) -> None:
        """Load adapter ``request`` (a ``vllm.lora.request.LoRARequest``) into the engine."""
        try:
            with ENGINE_LOCK:
                added = self.host.llm.llm_engine.add_lora(request)
        except Exception as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise EngineError(f"engine adapter load failed: {type(err).__name__}: {first}") from err
        if added is False:
            raise EngineError(f"engine adapter load failed: {request.lora_name} was not added")

    def remove(self, lora_id: int) -> None:
        """Drop adapter ``lora_id`` from the engine (nothing when it is not running)."""
        if self.host.llm is None:
            return
        with ENGINE_LOCK:
            self.host.llm.llm_engine.remove_lora(lora_id)

    def adapters(self) -> set[int]:
        """The adapter ids the engine holds now."""
        if self.host.llm is None:
            return set()
        with ENGINE_LOCK:
            return set(self.host.llm.llm_engine.list_loras())

    def close(self) -> None:
        """End the engine (idempotent)."""
        self.host.close()


class AdapterSampler(EngineSampler):
    """One run's view of an :class:`AdapterEngine`: its rows are sampled under its own adapter,
    named ``name`` (module docstring)."""

    def __init__(
        self,
        engine: AdapterEngine,
        name: str,
        device: torch.device,
        sample_kw: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(device, engine.host.spec, sample_kw)
        self.host = engine.host  # the pack's; this view never starts a host of its own
        self.engine = engine
        self.name = name
        self.request: Any = None  # the adapter version served now (a LoRARequest)

    def lora_request(self) -> Any:
        return self.request

    def _sync(self, weights: Any) -> float:
        """Serve ``weights``' active adapter as a new engine adapter and drop the previous
        version; the seconds it took (an engine start not counted)."""
        from vllm.lora.request import LoRARequest  # noqa: PLC0415 - the engine is optional

        first = self.request is None
        if not self.engine.ensure_started(weights) and first and self.engine.on_join:
            self.engine.on_join()
        t0 = time.perf_counter()
        assert self.engine.host.workdir is not None
        lora_id = self.engine.new_id()
        directory = os.path.join(self.engine.host.workdir, f"{self.name}-{lora_id}")
        write_adapter(weights, weights.active_adapter, directory)
        self._drop()
        request = LoRARequest(f"{self.name}-{lora_id}", lora_id, directory)
        self.engine.add(request)
        self.request = request
        return time.perf_counter() - t0

    def _drop(self) -> None:
        """Remove the adapter version served now from the engine and from disk."""
        request, self.request = self.request, None
        if request is None:
            return
        try:
            self.engine.remove(request.lora_int_id)
        finally:
            shutil.rmtree(request.lora_path, ignore_errors=True)

    def _close(self) -> None:
        """Free this run's adapter slot; the engine is the pack's to end."""
        self._drop()


def write_adapter(model: Any, adapter: str, directory: str) -> None:
    """Adapter ``adapter`` of the peft ``model`` as a directory the engine loads: peft's saved
    layout (``adapter_config.json`` and ``adapter_model.safetensors``, weights under the names
    ``save_pretrained`` gives them)."""
    from peft import get_peft_model_state_dict  # noqa: PLC0415 - LoRA is optional
    from safetensors.torch import save_file  # noqa: PLC0415

    os.makedirs(directory, exist_ok=True)
    state = get_peft_model_state_dict(model, adapter_name=adapter)
    save_file(
        {n: t.detach().to("cpu").contiguous().clone() for n, t in state.items()},
        os.path.join(directory, "adapter_model.safetensors"),
    )
    model.peft_config[adapter].save_pretrained(directory)


__all__ = ["AdapterEngine", "AdapterSampler", "write_adapter"]

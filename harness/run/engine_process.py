"""What starting the in-process engine does to the process, undone or kept off the console.

The engine runs in the run's own process (docs/engine.md), and its start changes that process in
ways the run, and every later run in the same process (a sweep worker), would otherwise see:

* **Model classes.** vLLM serves some architectures (Phi, GPT-NeoX, ...) through its
  Transformers backend, which builds the model from the ``transformers`` class itself and
  decorates that class for ``torch.compile`` in place (``support_torch_compile``: a base class
  added, ``__init__`` and ``__call__`` replaced). The learner's model is an instance of the same
  class: its next forward fails (``'PhiModel' object has no attribute 'do_not_compile'``) and a
  later run building the class fails in its constructor (``Current vLLM config is not set``).
  :func:`model_classes_kept` puts every loaded ``transformers`` model class back as it was once
  the engine is built. The engine's own instance keeps working: it runs eagerly
  (``enforce_eager``, or dynamo disabled on CPU), where the decorated ``__call__`` only calls
  ``forward``, as ``nn.Module.__call__`` does.
* **Console.** vLLM's start prints, besides its log lines (:func:`quiet_engine_logs`), a C++
  warning on the process's stderr, below Python (the CPU worker binding its memory to a NUMA
  node), and Python warnings about its own code (deprecated torch APIs it touches): none is about
  the user's run, and a sweep's console repeated them per cell. :func:`engine_start_quiet` drops
  exactly those while the engine starts.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import transformers

from harness.model.engine_support import engine_env, quiet_engine_logs

# Python warnings vLLM's start raises about its own code, not the user's: its scan of every
# loaded module's attributes touches the deprecated ``torch.distributed.reduce_op``, and it
# decorates with the deprecated ``torch.jit.script_method``.
ENGINE_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    (r".*torch\.distributed\.reduce_op", FutureWarning),
    (r".*torch\.jit\.script_method", DeprecationWarning),
)
# The C++ warning the CPU worker prints on stderr when it binds the process's memory to a NUMA
# node (``init_cpu_memory_env``); it goes past Python's logging and warnings.
STDERR_NOISE = re.compile(r"NUMA binding: Using \w+ policy")


def _model_classes() -> list[type]:
    """Every loaded ``transformers`` model class (the ones vLLM's Transformers backend may
    decorate: it decorates the decoder class of the model it builds)."""
    seen: dict[type, None] = {}
    todo = [transformers.PreTrainedModel]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen[sub] = None
                todo.append(sub)
    return list(seen)


@contextlib.contextmanager
def model_classes_kept() -> Iterator[None]:
    """Every loaded ``transformers`` model class as it was before the block: its bases and its
    own attributes (module docstring)."""
    saved = {cls: (cls.__bases__, dict(cls.__dict__)) for cls in _model_classes()}
    try:
        yield
    finally:
        for cls, (bases, attrs) in saved.items():
            _restore(cls, bases, attrs)


def _restore(cls: type, bases: tuple[type, ...], attrs: dict[str, Any]) -> None:
    now = dict(cls.__dict__)
    for name in now.keys() - attrs.keys():
        with contextlib.suppress(AttributeError, TypeError):
            delattr(cls, name)
    for name, value in attrs.items():
        if name in ("__dict__", "__weakref__"):
            continue
        if now.get(name, _MISSING) is not value:
            with contextlib.suppress(AttributeError, TypeError):
                setattr(cls, name, value)
    if cls.__bases__ != bases:
        cls.__bases__ = bases


_MISSING = object()


@contextlib.contextmanager
def stderr_filtered(noise: re.Pattern[str] = STDERR_NOISE) -> Iterator[None]:
    """The process's stderr (file descriptor 2, where C++ code writes) passed through, less the
    lines matching ``noise``.  A thread forwards what is written as it comes (a progress display
    on stderr keeps refreshing); a partial line is held only while it may still turn out to be a
    C++ warning line (those start ``[W``)."""
    fd = 2  # where C++ writes, whatever Python's sys.stderr is at the moment
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    try:
        saved = os.dup(fd)
    except OSError:  # no stderr to filter
        yield
        return
    read, write = os.pipe()
    os.dup2(write, fd)
    os.close(write)

    def forward() -> None:
        held = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(read, 65536):
                held += chunk
                *lines, held = held.split(b"\n")
                out = b"".join(
                    line + b"\n"
                    for line in lines
                    if not noise.search(line.decode("utf-8", "replace"))
                )
                if held and not held.startswith(b"[W"):
                    out, held = out + held, b""
                if out:
                    os.write(saved, out)
        if held and not noise.search(held.decode("utf-8", "replace")):
            with contextlib.suppress(OSError):
                os.write(saved, held)
        os.close(read)
        os.close(saved)

    thread = threading.Thread(target=forward, name="engine-stderr", daemon=True)
    thread.start()
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, fd)  # closes the pipe's last write end: the thread reads EOF, ends
        # A process started in the block that still holds the pipe keeps its stderr forwarded
        # until it exits (the thread closes both ends then), rather than writing into a closed pipe.
        thread.join(timeout=2)


@contextlib.contextmanager
def engine_start_quiet() -> Iterator[None]:
    """The engine's start without its noise on the console (module docstring): its Python
    warnings about its own code and its C++ NUMA line dropped, its log lines at ERROR (unless
    the user set ``VLLM_LOGGING_LEVEL``)."""
    with engine_env(quiet_engine_logs()), warnings.catch_warnings(), stderr_filtered():
        for message, category in ENGINE_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield


@contextlib.contextmanager
def engine_start() -> Iterator[None]:
    """Around building a ``vllm.LLM`` in this process: quiet (:func:`engine_start_quiet`), and
    the model classes and ``torch.set_num_threads`` left as they were (the CPU worker replaces
    ``set_num_threads`` with a no-op for the whole process: it expects a process of its own)."""
    set_threads = torch.set_num_threads
    try:
        with model_classes_kept(), engine_start_quiet():
            yield
    finally:
        torch.set_num_threads = set_threads


__all__ = [
    "ENGINE_WARNINGS",
    "STDERR_NOISE",
    "engine_start",
    "engine_start_quiet",
    "model_classes_kept",
    "stderr_filtered",
]

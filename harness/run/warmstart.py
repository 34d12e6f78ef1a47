"""Supervised warm start on task demonstrations, cached on disk and shared between processes.

Why: RL from a random policy on a 10^5-prompt task sees almost no reward signal; real PPO/GRPO
fine-tuning starts from an SFT model. A few hundred steps of imitation (prompt -> demonstration
+ EOS, loss on the completion tokens only) give the tiny model partial accuracy, so the
ablations compare clipping/normalisation options where they matter.

Why a cache: every trial of an ablation with the same model, task and warm-start settings would
otherwise repeat the same training. :func:`cached_warm_start` keys the weights by the SHA-256 of
a canonical JSON of everything they depend on, and serialises creation with an exclusive
``fcntl.flock`` so N workers asking at once train once: the first trains and publishes the file
with an atomic ``os.replace``; the others wait on the lock and load it. Weights are stored with
safetensors (no pickle: loading a cache file never executes code).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import math
import os
import random
import time
from pathlib import Path
from typing import Any, NoReturn

import safetensors.torch as st
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from harness.core.failures import WarmStartDiverged
from harness.core.locks import holder_record, wait_flock
from harness.model.build import model_fingerprint, params_finite
from harness.model.logprobs import forward_logprobs
from harness.model.prompting import apply_chat_template
from harness.tasks import Task

CACHE_FORMAT = 1
# The longest a run waits for another process training the same warm start.
WARM_START_LOCK_S = 1800.0
_logger = logging.getLogger(__name__)
# Above this size the initial weights are not hashed into the key (the directory fingerprint,
# file sizes and mtimes, stands in): hashing gigabytes per trial would cost seconds.
DIGEST_MAX_PARAMS = 100_000_000


def harness_version() -> str:
    try:
        return importlib.metadata.version("harness")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _encode_batch(
    tokenizer: PreTrainedTokenizerBase,
    pairs: list[tuple[str, str]],
    device: torch.device,
    chat_template: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ``prompt + completion + EOS`` ids, attention mask and completion mask.

    The prompt is tokenized exactly as :func:`harness.sampling.local.sample` does (default special
    tokens), the completion without special tokens, so the model learns the very token sequence
    it will later be asked to generate.
    """
    texts = apply_chat_template(tokenizer, [p for p, _ in pairs], chat_template)
    prompts = tokenizer(texts, add_special_tokens=chat_template is None)["input_ids"]
    completions = tokenizer([c for _, c in pairs], add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    seqs = [p + c + [eos] for p, c in zip(prompts, completions, strict=True)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    attn = torch.zeros(len(seqs), width, dtype=torch.long)
    target = torch.zeros(len(seqs), width, dtype=torch.float32)
    for i, (seq, p) in enumerate(zip(seqs, prompts, strict=True)):
        start = width - len(seq)
        ids[i, start:] = torch.tensor(seq)
        attn[i, start:] = 1
        target[i, start + len(p) :] = 1.0
    return ids.to(device), attn.to(device), target.to(device)


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    chat_template: str | None = None,
) -> dict[str, float]:
    """Train ``model`` in place with AdamW on ``task`` demonstrations; returns first/last loss.

    The loss is the mean negative log-likelihood of the completion tokens (demonstration + EOS)
    under the same forward pass and position-id convention that PPO uses. Training examples come
    from ``task.sample`` with ``random.Random(seed)``, so held-out prompts are never seen.
    The model's train/eval mode is left as it was (the built-in models have no dropout).
    :class:`WarmStartDiverged` when a step's loss, or the trained weights, are not finite.
    """
    if steps < 1 or batch_size < 1:
        raise ValueError("warm_start: steps and batch_size must be >= 1")
    device = next(model.parameters()).device
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses: list[float] = []
    t0 = time.perf_counter()
    for _ in range(steps):
        examples = task.sample(rng, batch_size)
        pairs = [(ex.prompt, task.demonstration(ex)) for ex in examples]
        ids, attn, target = _encode_batch(tokenizer, pairs, device, chat_template)
        logp, _ = forward_logprobs(model, ids, attn)
        loss = -(logp * target).sum() / target.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if not math.isfinite(losses[-1]):
            _diverged(f"its loss was {losses[-1]} at step {len(losses)} of {steps}", lr)
    if not params_finite(model):
        _diverged(f"its weights are not finite after {steps} steps", lr)
    return {
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "steps": float(steps),
        "seconds": time.perf_counter() - t0,
    }


def _diverged(what: str, lr: float) -> NoReturn:
    raise WarmStartDiverged(
        f"warm_start: the supervised warm start diverged ({what}); lower warm_start.lr "
        f"(now {lr:g}). Nothing was cached."
    )


def cache_key(parts: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON (sorted keys, no spaces) of ``parts``."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 over every state-dict entry (name, dtype, shape, bytes), in name order."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def cached_warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    *,
    model_spec: str,
    task_spec: str,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    cache_dir: Path | str,
    key_parts: dict[str, Any] | None = None,
    chat_template: str | None = None,
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """Warm-start ``model`` in place, or load the weights a previous call saved for the same key.

    The key is the SHA-256 of a canonical JSON of: the model spec and its fingerprint (tiny shape,
    or the directory's file sizes/mtimes), a digest of the model's *initial* weights (so the init
    seed is covered; skipped above :data:`DIGEST_MAX_PARAMS` parameters, where the directory
    fingerprint stands in), the task spec and the task's own ``fingerprint`` (its options; the
    content hash of a JSONL file), steps, batch size, lr, seed, the harness version, and
    ``key_parts`` (anything else the caller wants in it, e.g. task options). Returns the same
    ``model`` object and ``info`` with ``key``, ``path``, ``trained`` (True only in the process
    that trained), ``loss_first``, ``loss_last`` and ``seconds``.
    """
    n_params = sum(p.numel() for p in model.parameters())
    parts = {
        "format": CACHE_FORMAT,
        "harness": harness_version(),
        "model": model_fingerprint(model_spec) if model_spec != "tiny" else "tiny",
        "init_weights": weights_digest(model) if n_params <= DIGEST_MAX_PARAMS else None,
        "task": task_spec,
        "task_fingerprint": getattr(task, "fingerprint", task.name),
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "seed": seed,
        "extra": key_parts or {},
    }
    if chat_template is not None:  # keys of template-free runs stay what they were
        parts["chat_template"] = chat_template
    key = cache_key(parts)
    root = Path(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    weights = root / f"{key}.safetensors"

    if weights.exists():  # published files are complete: os.replace is atomic
        return model, _load_cached(model, root, key)
    with open(root / f"{key}.lock", "a+") as lock:
        _hold_lock(lock.fileno(), root / key)
        if weights.exists():
            return model, _load_cached(model, root, key)
        result = warm_start(
            model,
            tokenizer,
            task,
            steps=steps,
            batch_size=batch_size,
            lr=lr,
            seed=seed,
            chat_template=chat_template,
        )
        _publish(model, root, key, {"key_parts": parts, "result": result})
    return model, {**result, "key": key, "path": str(weights), "trained": True}


def _load_cached(model: PreTrainedModel, root: Path, key: str) -> dict[str, Any]:
    """Load the published weights of ``key`` into ``model``; the info of the run that trained
    them, marked as not trained here."""
    weights, meta_path = root / f"{key}.safetensors", root / f"{key}.json"
    st.load_model(model, weights, strict=True, device=str(next(model.parameters()).device))
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return {**meta.get("result", {}), "key": key, "path": str(weights), "trained": False}


def _hold_lock(fd: int, what: Path) -> None:
    """Take the cache key's exclusive lock on ``fd``, and name this process in the lock file."""
    # Released when the file closes, or by the kernel if this process dies; a live holder is
    # training the same warm start, which takes minutes, so the bound is generous.
    wait_flock(
        fd,
        timeout_s=WARM_START_LOCK_S,
        what=f"warm-start cache {what}",
        logger=_logger,
        hint="another run is training the same warm start and has not finished",
    )
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (holder_record() + "\n").encode(), 0)
    except OSError:
        pass  # the record only names the holder in a waiter's message


def _publish(model: PreTrainedModel, root: Path, key: str, record: dict[str, Any]) -> None:
    """Write ``key``'s metadata and weights, each through a temporary file and an atomic
    ``os.replace``; on any failure nothing half-written is left behind."""
    tmp = root / f".{key}.{os.getpid()}.tmp"
    meta_tmp = root / f".{key}.{os.getpid()}.json.tmp"
    try:
        meta_tmp.write_text(json.dumps(record, indent=2, default=str))
        st.save_model(model, str(tmp), metadata={"key": key})
        os.replace(meta_tmp, root / f"{key}.json")  # metadata first: whoever sees weights sees it
        os.replace(tmp, root / f"{key}.safetensors")
    except BaseException:  # a full disk: leave no half-written file taking up the space
        tmp.unlink(missing_ok=True)
        meta_tmp.unlink(missing_ok=True)
        raise


__all__ = [
    "WarmStartDiverged",
    "cache_key",
    "cached_warm_start",
    "harness_version",
    "warm_start",
    "weights_digest",
]

"""Packing K LoRA runs on one base model vs K unpacked runs: wall and peak RSS per trial.

Four cells that differ in PPO settings only (``ppo.eps_clip`` and ``optim.lr``) and share the
base (:data:`harness.run.packing.BASE_FIELDS`), on two models:

* the tiny Llama (``tests/support/tiny.py``'s shape, as most tests train);
* a random-init Qwen2 of Qwen2-0.5B's width (896, 14 query / 2 KV heads, MLP 4864) with 4 layers
  (~60M parameters, ~240 MB in float32), saved with ``save_pretrained`` and loaded as
  ``model: <dir>`` is.

Arms, each in a fresh process of its own (so every peak RSS is that arm's alone):

* **unpacked** (K = 1): each cell alone (``harness.run.loop.run``), one process per cell, one after
  another; per trial = the mean over the four processes;
* **packed K = 2**: cells 0-1 in one :func:`harness.run.packing.run_packed`;
* **packed K = 4**: all four cells in one.

Wall per trial: the seconds from before the base model is loaded to the last result (the
interpreter's start and the imports, which a sweep worker pays once, are left out), over K.
Peak RSS per trial: the process's peak resident set (``ru_maxrss``) over K; beside it the peak
above the process's RSS after the imports (the model, its adapters, optimizers and activations:
what a pack shares or not). Ratios are against the unpacked arm. The sampler is the local one.

``--engine``: the same arms with the vLLM engine as the sampler
(``rollout.sampler_backend: vllm``, in process), on the tiny Llama at width 64 (the engine's CPU
attention takes no head smaller than 32): unpacked, every trial starts an engine of its own
(its LoRA merged into the served weights); a pack starts one, serving the K adapters
(``harness/sampling/vllm_adapters.py``). Engine starts per trial are counted in each arm's
process. Recorded in a section of its own.

    .venv/bin/python benchmarks/bench_packing.py            # recorded
    .venv/bin/python benchmarks/bench_packing.py --engine   # the engine arms (3 repeats), recorded
    .venv/bin/python benchmarks/bench_packing.py --steps 2 --no-record
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
from _record import record  # noqa: E402

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
TINY_ENGINE = {**TINY, "hidden_size": 64, "intermediate_size": 128}
CELLS = [
    {"ppo.eps_clip": 0.1, "optim.lr": 1e-3},
    {"ppo.eps_clip": 0.2, "optim.lr": 3e-3},
    {"ppo.eps_clip": 0.3, "optim.lr": 1e-3},
    {"ppo.eps_clip": 0.2, "optim.lr": 1e-2},
]
LORA = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}


def rss_kib() -> int:
    """The process's resident set now, KiB (/proc/self/status VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def save_qwen2(workdir: str) -> None:
    """The random-init Qwen2 of the module docstring, with the harness tokenizer, in ``workdir``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from harness.model.build import build_tokenizer

    tok = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=4,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(workdir)
    tok.save_pretrained(workdir)


def configs(model: str, steps: int, k: int, engine: bool = False) -> list[Any]:
    from harness.config import build_run_config

    rollout: dict[str, Any] = {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 8}
    if engine:
        rollout["sampler_backend"] = "vllm"
    base = {
        "steps": steps,
        "model": model,
        "tiny": TINY_ENGINE if engine else TINY,
        "task": "reverse",
        "model_options": {"lora": LORA},
        "rollout": rollout,
        "ppo": {"ppo_n_minibatches": 2, "entropy_coef": 0.01},
        "eval": {"every": 0, "n_prompts": 2},
        "threads": 1,
    }
    return [build_run_config(base, cell) for cell in CELLS[:k]]


def child(args: argparse.Namespace) -> None:
    """One arm in this process; prints its measures as one JSON line."""
    from harness.run.loop import run
    from harness.run.packing import run_packed

    starts = count_engine_starts() if args.engine else [0]
    cfgs = configs(args.model, args.steps, args.k, engine=args.engine)
    baseline = rss_kib()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as results:
        if args.arm == "unpacked":
            results_list = [run(cfgs[args.cell], results_dir=results)]
        else:
            results_list = run_packed(cfgs, [{"results_dir": results}] * len(cfgs))
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "wall": wall,
                "peak_kib": peak,
                "baseline_kib": baseline,
                "engine_starts": starts[0],
                "statuses": [r.status for r in results_list],
            }
        )
    )


def count_engine_starts() -> list[int]:
    """Count this process's engine starts from now on (a one-element list, updated in place)."""
    from harness.sampling.vllm import EngineHost

    count = [0]
    start = EngineHost.start

    def counted(host: Any, model: Any) -> None:
        count[0] += 1
        start(host, model)

    EngineHost.start = counted  # type: ignore[method-assign]
    return count


def arm(
    model: str, steps: int, arm_name: str, k: int, cell: int = 0, engine: bool = False
) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", arm_name, "--model", model]
    cmd += ["--steps", str(steps), "--k", str(k), "--cell", str(cell)]
    cmd += ["--engine"] if engine else []
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if any(s != "completed" for s in got["statuses"]):
        raise SystemExit(f"{arm_name} K={k} on {model}: {got['statuses']}")
    return got


def measure(model: str, steps: int, engine: bool = False) -> dict[int, dict[str, float]]:
    """Per trial, for K = 1 (unpacked, mean of four processes), 2 and 4 (packed)."""
    alone = [arm(model, steps, "unpacked", 4, cell, engine) for cell in range(4)]
    rows = {
        1: {
            "wall": sum(a["wall"] for a in alone) / 4,
            "peak": sum(a["peak_kib"] for a in alone) / 4,
            "above": sum(a["peak_kib"] - a["baseline_kib"] for a in alone) / 4,
            "starts": sum(a["engine_starts"] for a in alone) / 4,
        }
    }
    for k in (2, 4):
        got = arm(model, steps, "packed", k, engine=engine)
        rows[k] = {
            "wall": got["wall"] / k,
            "peak": got["peak_kib"] / k,
            "above": (got["peak_kib"] - got["baseline_kib"]) / k,
            "starts": got["engine_starts"] / k,
        }
    return rows


def table(results: dict[str, dict[int, dict[str, float]]], engine: bool = False) -> str:
    lines = [
        "| model | K | wall s / trial | × unpacked | peak RSS MiB / trial | × unpacked "
        "| peak above imports MiB / trial | × unpacked |"
        + (" engine starts / trial |" if engine else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|" if engine else ""),
    ]
    for label, rows in results.items():
        one = rows[1]
        for k, r in rows.items():
            kind = "1 (unpacked)" if k == 1 else f"{k} (packed)"
            lines.append(
                f"| {label} | {kind} | {r['wall']:.2f} | {r['wall'] / one['wall']:.2f} "
                f"| {r['peak'] / 1024:.0f} | **{r['peak'] / one['peak']:.2f}** "
                f"| {r['above'] / 1024:.0f} | {r['above'] / one['above']:.2f} |"
                + (f" {r['starts']:.2f} |" if engine else "")
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4, help="PPO steps per trial")
    ap.add_argument("--no-record", action="store_true", help="print, do not write results/")
    ap.add_argument(
        "--engine", action="store_true", help="the vLLM engine arms (tiny model) instead"
    )
    ap.add_argument("--repeats", type=int, default=3, help="--engine: repeats of every arm")
    ap.add_argument("--child", choices=("unpacked", "packed"), help=argparse.SUPPRESS)
    ap.add_argument("--model", default="tiny", help=argparse.SUPPRESS)
    ap.add_argument("--k", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--cell", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.arm = args.child
        child(args)
        return
    if args.engine:
        engine_main(args)
        return
    load_before = os.getloadavg()[0]
    results: dict[str, dict[int, dict[str, float]]] = {}
    results["tiny Llama (1 layer, width 32)"] = measure("tiny", args.steps)
    with tempfile.TemporaryDirectory() as qwen:
        save_qwen2(qwen)
        results["Qwen2 (4 layers, width 896, ~60M params)"] = measure(qwen, args.steps)
    load_after = os.getloadavg()[0]
    body = (
        f"Command: `.venv/bin/python benchmarks/bench_packing.py --steps {args.steps}`. Four "
        "LoRA cells (r 8 on q_proj/v_proj; eps_clip and lr differ) of the reverse task, "
        f"{args.steps} PPO steps each, 2 prompts × 2 samples × 8 new tokens, one thread, "
        "local sampler (HF forward under peft). K = 1: each cell alone in its own process (mean "
        "of four); K = 2, 4: one process with `run_packed`. Wall from before the model load to "
        "the last result, over K; peak RSS (`ru_maxrss`) over K, and the peak above the "
        "process's RSS after its imports, over K. The engine arms are a section of their own "
        "(`--engine`; the goal of <= 0.5x is for the engine). "
        f"1-min load average {load_before:.1f} before, {load_after:.1f} after.\n\n"
        + table(results)
        + "\n\nA pack's peak is one process's: one torch, one base model; each trial adds its "
        "adapters, their AdamW state and its step's activations. With the local sampler the "
        "trials take turns on the same core, so the wall per trial falls only by the setup a "
        "pack does once (the model load) and the per-trial overhead it shares; the steps "
        "themselves cost what they cost unpacked."
    )
    print(body)
    if not args.no_record:
        record("Packing LoRA runs on one base model (benchmarks/bench_packing.py)", body)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def engine_main(args: argparse.Namespace) -> None:
    """The engine arms on the tiny model, with a verdict against the goal (K = 4 at <= 0.5x
    the wall and <= 0.5x the peak RSS per trial of four unpacked engine trials)."""
    before = uptime()
    t0 = time.perf_counter()
    # Repeats of every arm, in turn: the load of the shared machine moves between them, and a
    # K = 4 arm against the unpacked arms of the same repeat is the fairest ratio there is.
    repeats = [measure("tiny", args.steps, engine=True) for _ in range(args.repeats)]
    seconds = time.perf_counter() - t0
    after = uptime()
    rows = {
        k: {q: statistics.median(r[k][q] for r in repeats) for q in repeats[0][k]}
        for k in repeats[0]
    }
    results = {"tiny Llama (1 layer, width 64), engine": rows}
    walls = sorted(r[4]["wall"] / r[1]["wall"] for r in repeats)
    rss = sorted(r[4]["peak"] / r[1]["peak"] for r in repeats)
    wall4, rss4 = statistics.median(walls), statistics.median(rss)
    met = wall4 <= 0.5 and rss4 <= 0.5
    verdict = (
        f"Goal (K = 4 at <= 0.5x the wall and <= 0.5x the peak RSS per trial of four unpacked "
        f"trials, with the engine): **{'met' if met else 'not met'}** in the median of "
        f"{len(repeats)} repeat(s): wall {wall4:.2f}x (per repeat: "
        f"{', '.join(f'{w:.2f}x' for w in walls)}), peak RSS {rss4:.2f}x (per repeat: "
        f"{', '.join(f'{x:.2f}x' for x in rss)})."
    )
    body = (
        f"Command: `.venv/bin/python benchmarks/bench_packing.py --engine --steps {args.steps} "
        f"--repeats {args.repeats}` (whole script {seconds:.0f} s). The four cells of "
        "the local sampler's section (the script without `--engine`), "
        f"{args.steps} PPO steps each, with `rollout.sampler_backend: vllm` (the engine "
        "in process, float32, 1 GiB KV cache) on the tiny Llama at width 64 (intermediate "
        "128; the engine's CPU attention takes no head smaller than 32). K = 1: each cell "
        "alone in its own process (mean of four), each starting its own engine, which serves "
        "the LoRA merged into the base weights; K = 2, 4: one process with `run_packed`, one "
        "engine serving the K adapters. Wall, peak RSS and the peak above the imports as "
        "above, per trial; engine starts counted in each process (`EngineHost.start` calls), "
        f"per trial; the table's numbers are the medians over the repeats (each repeat runs every arm). Load (`uptime`) before: `{before}`; after: `{after}`.\n\n"
        + table(results, engine=True)
        + "\n\n"
        + verdict
        + " What a pack saves with the engine is the engine: its start (seconds, here most "
        "of a short run's wall) and its footprint (the KV cache, the engine's copy of the "
        "weights, vLLM's own modules and threads) are paid once for K trials. The steps "
        "themselves still take turns on the same cores."
    )
    print(body)
    if not args.no_record:
        record(
            "Packing LoRA runs on one base model, with the vLLM engine "
            "(benchmarks/bench_packing.py --engine)",
            body,
        )


if __name__ == "__main__":
    main()

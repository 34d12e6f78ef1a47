"""Asynchronous PPO on the threads clock vs the synchronous loop: steps/s, tokens/s, idle shares.

Every arm is the real training loop (``harness.run.loop.run``) in this one process, on the same
model, task, seed and shape (``--prompts`` × ``--samples`` rows × ``--new`` tokens per step,
``--steps`` steps), so the work per step is the same and steps/s compare:

* **sync** (the reference): no ``rollout.async``; the sampler and the learner take turns;
* **η = 1 / 2, between_batches / in_flight**: ``rollout.async`` with ``clock: threads``,
  ``max_staleness`` 1 or 2 and ``weight_updates`` between batches or in flight (KV kept): the
  sampler runs in its own thread beside the learner.

Per arm: steps/s and generated tokens/s over the measured steps (the wall time between the
metrics of the last warm-up step and of the second-to-last step: the last step runs the final
evaluation), the sampler's and the learner's idle share of that wall time (async arms:
``async/sampler_idle_s``, ``async/learner_idle_s``; the synchronous sampler idles while the
learner works, ``perf/step_time`` − ``perf/rollout_time``, and the learner idles while it samples,
``perf/rollout_time``), the median ``perf/rollout_time`` (async: the learner's wait for its batch
plus scoring) and ``perf/update_time`` per step, the sampler's busy time per step (wall − its
idle time; against the synchronous g it shows how much sharing the cores slowed it), and the
process's CPU seconds per wall second (how many of the cores the run kept busy).

What limits the overlap is read off a second table: each thread's wall time split, from the
kernel's per-thread schedstat, into time on a CPU, time runnable but waiting for a CPU (the
machine's load: other processes, or the other thread when both want the one core left) and time
blocked; blocked time beyond the thread's own idle waits (its batch, its admission) is mostly
waiting for the GIL. Then, sampled every 50 ms, the share of the time both threads were runnable
and, of that, the share they sat on the same CPU (taking turns on one core, so overlap gives
nothing). Beside it the whole machine's busy cores and stolen time (/proc/stat) and the 1-min
load average at the arm's end.

The ideal speed-up of perfect overlap is (g + t) / max(g, t), with g and t the synchronous arm's
median sampler time (``perf/rollout_time``) and learner time (``perf/update_time``) per step; each
async arm's achieved ratio (its steps/s over the synchronous arm's) is shown as a share of it.

EOS stays reachable (a random-init model ends a row with probability ~1/vocabulary per token), so
the rows' lengths differ a little between arms; the local decoder still runs each batch until its
longest row ends (``--new`` steps in practice), and tokens/s counts the tokens actually generated.
The learning rate is 1e-9: the same optimizer work, but the policy stays as initialised, so every
arm samples lengths from the same distribution (at a real learning rate the arms' policies, and
their completion lengths, drift apart within ten steps).
The mismatch probe is off in every arm (``rollout.measure_mismatch: false``): under asynchrony it
runs an extra learner forward per stale version, work the synchronous arm does not do.
Evaluation only at the end (``eval.every: 0``, 8 prompts), outside the measured steps.

``--engine`` adds the same arms with the vLLM engine (``rollout.sampler_backend: vllm``, its
step-level sampler on the threads clock; vLLM is optional). An arm the config refuses is shown
with the refusal.

    .venv/bin/python benchmarks/bench_async.py --engine   # recorded
    .venv/bin/python benchmarks/bench_async.py            # the local decoder only
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _record import record  # noqa: E402

from harness.config import build_run_config  # noqa: E402
from harness.core.configtools import ConfigError  # noqa: E402

CMD = ".venv/bin/python benchmarks/bench_async.py"
SECTION = "Asynchronous PPO (threads clock) vs synchronous: steps/s"

MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "w256": (
        "Llama (4 layers, width 256)",
        {
            "tiny.hidden_size": 256,
            "tiny.num_layers": 4,
            "tiny.num_heads": 4,
            "tiny.intermediate_size": 512,
        },
    ),
    "tiny": ("tiny Llama (default: 2 layers, width 128)", {}),
}
ARMS: list[tuple[str, dict[str, Any]]] = [("sync", {})] + [
    (
        f"η={eta}, {mode}",
        {
            "rollout.async.max_staleness": eta,
            "rollout.async.weight_updates": mode,
            "rollout.async.clock": "threads",
        },
    )
    for eta in (1, 2)
    for mode in ("between_batches", "in_flight")
]
SAMPLERS = {
    "local": {"rollout.sampler_backend": "fast"},
    "engine": {"rollout.sampler_backend": "vllm"},
}


# The same optimizer work at a learning rate that leaves the policy as initialised, so every arm
# samples from the same distribution (the same completion lengths, hence the same work): at 3e-4
# the arms' policies drift apart within ten steps, and their mean lengths with them (19 against
# 27 tokens per row seen here).
LR = 1e-9
SAMPLER_THREAD = "harness-async-sampler"
PLACEMENT_S = 0.05  # ThreadedRollouts' thread name
TICK = os.sysconf("SC_CLK_TCK")


def thread_sched(native_id: int | None) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of a thread of this process
    (the kernel's schedstat; zeros when the thread is gone)."""
    if native_id is None:
        return 0.0, 0.0
    try:
        run_ns, wait_ns, _ = Path(f"/proc/self/task/{native_id}/schedstat").read_text().split()
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(run_ns) / 1e9, int(wait_ns) / 1e9


def machine_cpu() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine so far (/proc/stat)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = f[3] + f[4]
    steal = f[7] if len(f) > 7 else 0
    return (sum(f[:8]) - idle - steal) / TICK, steal / TICK


def snapshot() -> dict[str, Any]:
    """What a measured interval's accounting needs, taken in the main (learner) thread."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    sampler = next((t for t in threading.enumerate() if t.name == SAMPLER_THREAD), None)
    return {
        "wall": time.perf_counter(),
        "cpu": r.ru_utime + r.ru_stime,
        "main": thread_sched(threading.get_native_id()),
        "sampler": thread_sched(sampler.native_id if sampler else None),
        "machine": machine_cpu(),
    }


def interval(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """Per wall second between two snapshots: the process's CPU, the machine's busy and stolen
    CPU, and each thread's time on a CPU and waiting for one."""
    wall = b["wall"] - a["wall"]
    out = {
        "wall": wall,
        "cores": (b["cpu"] - a["cpu"]) / wall,
        "machine": (b["machine"][0] - a["machine"][0]) / wall,
        "steal": (b["machine"][1] - a["machine"][1]) / wall,
    }
    for side in ("main", "sampler"):
        out[f"{side}_run"] = (b[side][0] - a[side][0]) / wall
        out[f"{side}_queue"] = (b[side][1] - a[side][1]) / wall
    return out


def thread_cpu(native_id: int) -> tuple[str, int] | None:
    """(state, CPU it last ran on) of a thread of this process (/proc/self/task/ID/stat)."""
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[36])


class Placement(threading.Thread):
    """Samples every ``PLACEMENT_S`` where the learner (main) and sampler threads are: for each
    sample where both are runnable, whether they sit on the same CPU (then they take turns on
    one core, whatever the overlap could give)."""

    def __init__(self) -> None:
        super().__init__(name="bench-placement", daemon=True)
        self.samples: list[tuple[float, bool]] = []  # (time, same CPU) with both runnable
        self.done = threading.Event()
        self.main = threading.main_thread().native_id

    def run(self) -> None:
        while not self.done.wait(PLACEMENT_S):
            sampler = next((t for t in threading.enumerate() if t.name == SAMPLER_THREAD), None)
            if sampler is None or sampler.native_id is None or self.main is None:
                continue
            a, b = thread_cpu(self.main), thread_cpu(sampler.native_id)
            if a and b and a[0] == "R" and b[0] == "R":
                self.samples.append((time.perf_counter(), a[1] == b[1]))

    def share(self, t0: float, t1: float) -> tuple[float, float]:
        """(samples with both runnable, share of those on one CPU) between ``t0`` and ``t1``."""
        inside = [same for t, same in self.samples if t0 <= t <= t1]
        n_all = max((t1 - t0) / PLACEMENT_S, 1.0)
        return len(inside) / n_all, (sum(inside) / len(inside) if inside else float("nan"))


def overrides(args: argparse.Namespace, model: str, sampler: str, arm: dict[str, Any]) -> dict:
    return {
        "steps": args.warmup + args.steps + 1,  # + the last step, which runs the final eval
        "threads": args.threads,
        "seed": 0,
        "task": "reverse",
        "rollout.prompts_per_step": args.prompts,
        "rollout.n_samples": args.samples,
        "rollout.max_new_tokens": args.new,
        "rollout.measure_mismatch": False,
        "optim.lr": LR,
        "eval.every": 0,
        "eval.n_prompts": 8,
        **MODELS[model][1],
        **SAMPLERS[sampler],
        **arm,
    }


def run_arm(args: argparse.Namespace, model: str, sampler: str, arm: dict[str, Any]) -> dict:
    """One training run; its measured steps summarised (module docstring), or the config's
    refusal as ``{"refused": reason}``."""
    from harness.run.loop import run

    try:
        cfg = build_run_config(overrides=overrides(args, model, sampler, arm))
    except (ConfigError, ValueError) as err:
        return {"refused": str(err).splitlines()[0]}
    marks: list[dict[str, Any]] = []  # a snapshot at each step's metrics

    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        marks.append(snapshot())

    placement = Placement()
    placement.start()
    try:
        with warnings.catch_warnings(), tempfile.TemporaryDirectory() as d:
            warnings.simplefilter("ignore")
            res = run(cfg, results_dir=d, on_metrics=on_metrics)
    finally:
        placement.done.set()
        placement.join()
    if res.status != "completed":
        return {"refused": f"run {res.status}: {res.reason}"}
    w, n = args.warmup, args.steps
    h = {k: v[w : w + n] for k, v in res.history.items()}
    acc = interval(marks[w - 1], marks[w + n - 1])
    both, same = placement.share(marks[w - 1]["wall"], marks[w + n - 1]["wall"])
    wall = acc["wall"]
    rows = args.prompts * args.samples
    tokens = sum(x * rows for x in h["rollout/response_length"])
    if "async/sampler_idle_s" in h:
        s_idle = sum(h["async/sampler_idle_s"])
        l_idle = sum(h["async/learner_idle_s"])
    else:
        s_idle = sum(
            s - r for s, r in zip(h["perf/step_time"], h["perf/rollout_time"], strict=True)
        )
        l_idle = sum(h["perf/rollout_time"])
    return {
        "steps_s": n / wall,
        "tokens_s": tokens / wall,
        "tokens_step": tokens / n,
        "s_idle": s_idle / wall,
        "l_idle": l_idle / wall,
        "g": statistics.median(h["perf/rollout_time"]),
        "t": statistics.median(h["perf/update_time"]),
        "busy": (wall - s_idle) / n,
        **acc,
        "both_runnable": both,
        "same_cpu": same,
        "load": os.getloadavg()[0],
        "lag": statistics.mean(h["async/token_lag_mean"]) if "async/token_lag_mean" in h else 0.0,
    }


def bench(args: argparse.Namespace, model: str, sampler: str) -> list[tuple[str, dict]]:
    """Every arm ``--repeats`` times, interleaved (sync, η=1 ..., sync, ...); per arm the
    repeat with the median steps/s."""
    runs: dict[str, list[dict]] = {name: [] for name, _ in ARMS}
    for _ in range(args.repeats):
        for name, arm in ARMS:
            r = run_arm(args, model, sampler, arm)
            runs[name].append(r)
            shown = r.get("refused") or (
                f"{r['steps_s']:.3f} steps/s, {r['tokens_s']:.0f} tok/s, sampler idle "
                f"{r['s_idle']:.0%}, learner idle {r['l_idle']:.0%}, g {r['g']:.2f} s, "
                f"t {r['t']:.2f} s, {r['cores']:.2f} cores, load {os.getloadavg()[0]:.2f}"
            )
            print(f"[{model}/{sampler}] {name}: {shown}", flush=True)
    out = []
    for name, rs in runs.items():
        ok = sorted((r for r in rs if "refused" not in r), key=lambda r: r["steps_s"])
        out.append((name, ok[len(ok) // 2] if ok else rs[0]))
    return out


def table(results: list[tuple[str, str, list[tuple[str, dict]]]]) -> str:
    head = (
        "| model | sampler | arm | steps/s | ratio | of the ideal | tokens/s | tokens/step "
        "| sampler idle | learner idle | rollout s/step | sampler busy s/step | update s/step "
        "| cores busy | mean token lag |\n" + "|---" * 15 + "|\n"
    )
    lines = []
    for model, sampler, arms in results:
        ref = dict(arms)["sync"]
        if "refused" in ref:
            lines.append(f"| {MODELS[model][0]} | {sampler} | sync | {ref['refused']} |")
            continue
        g, t = ref["g"], ref["t"]
        ideal = (g + t) / max(g, t)
        for name, r in arms:
            if "refused" in r:
                lines.append(
                    f"| {MODELS[model][0]} | {sampler} | {name} | — (refused: {r['refused']}) |"
                )
                continue
            ratio = r["steps_s"] / ref["steps_s"]
            share = f"ideal {ideal:.2f}×" if name == "sync" else f"**{ratio / ideal:.0%}**"
            lines.append(
                f"| {MODELS[model][0]} | {sampler} | {name}{' (ref)' if name == 'sync' else ''} "
                f"| {r['steps_s']:.3f} | **{ratio:.2f}×** | {share} | {r['tokens_s']:.0f} "
                f"| {r['tokens_step']:.0f} | {r['s_idle']:.0%} | {r['l_idle']:.0%} | {r['g']:.2f} "
                f"| {r['busy']:.2f} | {r['t']:.2f} | {r['cores']:.2f} | {r['lag']:.2f} |"
            )
    return head + "\n".join(lines)


def threads_table(results: list[tuple[str, str, list[tuple[str, dict]]]]) -> str:
    """Where each thread's wall time went, and what the rest of the machine was doing."""
    head = (
        "| model | sampler | arm | learner thread: on CPU / waiting for a CPU / blocked "
        "(waiting for its batch + other) | sampler thread: on CPU / waiting for a CPU / blocked "
        "(idle + other) | both runnable | of which on one CPU | this process, cores "
        "| whole machine, cores busy | stolen | 1-min load |\n" + "|---" * 11 + "|\n"
    )
    pct = lambda x: f"{x:.0%}"  # noqa: E731
    lines = []
    for model, sampler, arms in results:
        for name, r in arms:
            if "refused" in r:
                continue
            sync = name == "sync"
            parts = []
            for side, idle in (("main", r["l_idle"]), ("sampler", r["s_idle"])):
                run, queue = r[f"{side}_run"], r[f"{side}_queue"]
                blocked = max(1 - run - queue, 0.0)
                if sync and side == "sampler":
                    parts.append("— (the learner's thread samples)")
                    continue
                wait = 0.0 if sync else idle  # the synchronous thread never waits for the other
                other = max(blocked - wait, 0.0)
                parts.append(
                    f"{pct(run)} / {pct(queue)} / {pct(blocked)} ({pct(wait)} + {pct(other)})"
                )
            both, same = r.get("both_runnable"), r.get("same_cpu")
            place = (
                "— | —"
                if sync or both is None
                else f"{pct(both)} | {'—' if same != same else pct(same)}"  # nan: no sample
            )
            lines.append(
                f"| {MODELS[model][0]} | {sampler} | {name} | {parts[0]} | {parts[1]} | {place} "
                f"| {r['cores']:.2f} | {r['machine']:.2f} | {r['steal']:.2f} | {r['load']:.1f} |"
            )
    return head + "\n".join(lines)


def autogroup() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


def verdict(results: list[tuple[str, str, list[tuple[str, dict]]]]) -> str:
    """The goal, checked on the first model with the engine (else the local decoder), and what
    the thread accounting says limits the overlap."""
    model, sampler, arms = next(
        (x for x in results if x[1] == "engine"), results[0] if results else ("", "", [])
    )
    ref = dict(arms).get("sync", {"refused": "no synchronous arm"})
    ok = [(n, r) for n, r in arms if n != "sync" and "refused" not in r]
    if "refused" in ref or not ok:
        return "No verdict: the synchronous arm or every async arm was refused."
    ideal = (ref["g"] + ref["t"]) / max(ref["g"], ref["t"])
    name, best = max(ok, key=lambda x: x[1]["steps_s"])
    ratio = best["steps_s"] / ref["steps_s"]
    mark = lambda c: "✓" if c else "✗"  # noqa: E731
    every = [r for _, r in ok]
    mean = lambda k: statistics.mean(r[k] for r in every)  # noqa: E731
    queue = statistics.mean((r["main_queue"] + r["sampler_queue"]) / 2 for r in every)
    other = statistics.mean(
        max(1 - r[f"{side}_run"] - r[f"{side}_queue"] - r[idle], 0.0)
        for r in every
        for side, idle in (("main", "l_idle"), ("sampler", "s_idle"))
    )
    sames = [r["same_cpu"] for r in every if r.get("same_cpu", float("nan")) == r.get("same_cpu")]
    same = statistics.mean(sames) if sames else float("nan")
    text = (
        f"Goal ({MODELS[model][0]}, {sampler}): the best async arm ({name}) ran "
        f"**{ratio:.2f}×** the synchronous steps/s {mark(ratio >= 1.3)} (goal ≥ 1.3×), "
        f"**{ratio / ideal:.0%}** of the ideal {ideal:.2f}× {mark(ratio / ideal >= 0.8)} "
        "(goal ≥ 80 %).  Over its async arms each thread waited for a CPU "
        f"{queue:.0%} of the wall time on average and was blocked outside its own idle waits "
        f"(the GIL, locks) {other:.0%}; the process kept {mean('cores'):.2f} of the 2 cores "
        f"busy while the whole machine's were {mean('machine'):.2f} busy"
        + (
            f"; when both threads were runnable they sat on the same CPU in {same:.0%} of the "
            "samples.  "
            if same == same
            else ".  "
        )
    )
    if queue > 0.2:
        text += (
            "What limits it is the machine's load: both threads are runnable but wait for a "
            "core, mostly the same one"
            + (
                " (the kernel's autogroup scheduling is on, so this process's session gets "
                "about its fair share of the 2 cores however many threads it runs)"
                if autogroup()
                else ""
            )
            + "; overlap cannot add CPU time the session does not get."
        )
    elif other > 0.1:
        text += "What limits it is the GIL: the threads block on each other's Python work."
    else:
        text += "Neither the load nor the GIL holds the threads back much here."
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="w256,tiny", help=f"of {','.join(MODELS)}")
    ap.add_argument(
        "--engine",
        action="store_true",
        help="also the arms with the vLLM engine as the sampler (rollout.sampler_backend vllm)",
    )
    ap.add_argument("--steps", type=int, default=8, help="measured steps per arm")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="the runs' torch threads")
    ap.add_argument("--no-record", action="store_true", help="print only")
    ap.add_argument("--save", help="also write the measurements to this JSON file")
    ap.add_argument("--load", help="render (and record) the measurements of a --save instead")
    args = ap.parse_args()
    if args.warmup < 1:
        ap.error("--warmup: at least 1 (the measured wall time starts at a warm-up step's end)")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.load:
        saved = json.loads(Path(args.load).read_text())
        args = argparse.Namespace(**{**vars(args), **saved["args"], "no_record": args.no_record})
        results, load0, load1, wall = (saved[k] for k in ("results", "load0", "load1", "wall"))
    else:
        load0 = os.getloadavg()
        t_all = time.perf_counter()
        samplers = ["local"] + (["engine"] if args.engine else [])
        results = [(m, s, bench(args, m, s)) for m in args.models.split(",") for s in samplers]
        load1 = os.getloadavg()
        wall = time.perf_counter() - t_all
    if args.save:
        keep = {k: v for k, v in vars(args).items() if k not in ("save", "load", "no_record")}
        Path(args.save).write_text(
            json.dumps(
                {"args": keep, "results": results, "load0": load0, "load1": load1, "wall": wall}
            )
        )
    tab = table(results) + "\n\n" + verdict(results) + "\n\n" + threads_table(results)
    print(tab)
    loads = lambda la: "/".join(f"{x:.2f}" for x in la)  # noqa: E731
    print(
        f"total {wall:.0f} s; load average (1/5/15 min) {loads(load0)} before, {loads(load1)} after"
    )
    flags = "".join(
        f" --{k} {getattr(args, k)}"
        for k, d in (
            ("models", "w256,tiny"),
            ("steps", 8),
            ("warmup", 2),
            ("repeats", 1),
            ("prompts", 16),
            ("samples", 8),
            ("new", 32),
            ("threads", 1),
        )
        if getattr(args, k) != d
    ) + (" --engine" if args.engine else "")
    body = (
        f"Command: `{CMD}{flags}` (torch threads per run: {args.threads}, so one each for the "
        "sampler thread and the learner; whole script "
        f"{wall:.0f} s; load average (1/5/15 min) {loads(load0)} before, {loads(load1)} after: "
        "the 2 cores are shared with other work).  Every arm is the real training loop "
        f"(`harness.run.loop.run`, `reverse`, seed 0, random init), {args.prompts} prompts × "
        f"{args.samples} samples × {args.new} new tokens per step, default PPO settings "
        f"(4 minibatches) at lr {LR:g} (the policy stays as initialised, so every arm samples "
        f"the same length distribution), mismatch probe off, {args.warmup} warm-up + {args.steps} measured "
        f"steps (median of {args.repeats} interleaved repeat(s)).  Reference: the synchronous "
        "arm.  Async arms: `rollout.async` with `clock: threads` (sampler in its own thread, "
        "`in_flight` keeps the KV).  The engine (`rollout.sampler_backend: vllm`) runs in this "
        "process, its core in the sampler's thread (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the "
        "harness's only engine placement; an engine core in its own process is not measured).  "
        "Ideal = (g + t)/max(g, t) from the synchronous arm's "
        "median `perf/rollout_time` g and `perf/update_time` t; of the ideal = ratio / ideal "
        "(goal ≥ 1.3× and ≥ 80 % with the engine).  Idle shares of the measured wall time: "
        "async `async/sampler_idle_s`, `async/learner_idle_s`; sync sampler = step − rollout, "
        "learner = rollout.  Rollout s/step = median `perf/rollout_time` (async: the "
        "learner's wait for its batch + scoring); sampler busy = (wall − sampler idle)/step; "
        "update = median `perf/update_time`.  Cores busy = the process's CPU seconds per wall second.  "
        "Tokens = tokens actually generated (EOS reachable).  Second table: each thread's "
        "measured wall time from the kernel's schedstat, on a CPU / runnable but waiting for a "
        "CPU / blocked; blocked beyond the thread's own idle waits is mostly the GIL; both "
        "runnable = share of 50 ms samples with both threads runnable, of which on one CPU = "
        "the share of those where they sat on the same CPU.\n\n" + tab
    )
    if not args.no_record:
        record(SECTION, body)


if __name__ == "__main__":
    main()

"""Hostile input corpus: huge, deep, slow or malformed inputs get exit code 2 and one line (naming
the file and row where there is one), before anything is allocated, rendered for long or written.

Size cases run in ONE child process under an address-space limit and a timeout
(tests/support/memory_limit.py), so a regression fails its case with a ``MemoryError`` instead of
taking the shared machine down.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from tests.support.memory_limit import SMALL, assert_one_line, run_batch_under_memory_limit
from tests.support.tiny import TINY

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024
TINY_BASE = {
    "task": "reverse",
    "tiny": TINY,
    "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 4},
    "eval": {"every": 0, "n_prompts": 4},
}


def rows(n: int = 50) -> list[dict[str, str]]:
    return [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(n)]


def write_jsonl(path: Path, records: list[Any], insert: dict[int, bytes] | None = None) -> Path:
    """``records`` as JSON lines; ``insert`` puts raw bytes at 1-based line numbers."""
    lines = [(json.dumps(r) + "\n").encode() for r in records]
    for lineno, raw in sorted((insert or {}).items()):
        lines.insert(lineno - 1, raw)
    path.write_bytes(b"".join(lines))
    return path


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that costs no disk (and no time to write)."""
    with path.open("wb") as fh:
        fh.truncate(size)
    return path


def model_dir(root: Path, name: str, base: Path, **config: Any) -> Path:
    """A copy of the model directory ``base`` with ``config`` merged into its config.json
    (None deletes a key)."""
    import shutil

    path = root / name
    shutil.copytree(base, path)
    cfg = json.loads((path / "config.json").read_text())
    for key, value in config.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))
    return path


# --- size cases: built here, run in one memory-limited child ------------------------------------

Case = tuple[
    list[str], str, dict[str, Any]
]  # argv, expected text, harness.config.preflight overrides


def _size_cases(tmp: Path, qwen: Path) -> dict[str, Case]:
    r = ["--results-dir", str(tmp / "results")]
    long_prompt = write_jsonl(
        tmp / "long.jsonl",
        rows(),
        {21: (json.dumps({"prompt": "7" * 1_000_000, "answer": "1"}) + "\n").encode()},
    )
    huge_prompt = write_jsonl(
        tmp / "huge.jsonl",
        rows(),
        {21: (json.dumps({"prompt": "7" * 2_000_000, "answer": "1"}) + "\n").encode()},
    )
    big_task = sparse(tmp / "big.jsonl", 65 * MIB)
    big_run = sparse(tmp / "big-run.yaml", 200 * 1000 * 1000)
    big_exp = sparse(tmp / "big-exp.yaml", 200 * 1000 * 1000)
    big_template = sparse(tmp / "big.jinja", 2 * MIB)
    loop = tmp / "loop.jinja"
    loop.write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
        "{{ messages[0]['content'] }}"
    )
    padded = model_dir(tmp, "padded", qwen)
    text = (padded / "config.json").read_text()
    (padded / "config.json").write_text(text[:-1] + " " * (5 * MIB) + "}")  # valid, 5 MiB
    grid = tmp / "grid.yaml"
    grid.write_text(
        yaml.safe_dump(
            {
                "name": "widedeep",
                "base": TINY_BASE,
                # each value fits alone; 2048 wide x 1024 deep is 17.6 G parameters
                "grid": {"tiny.hidden_size": [32, 2048], "tiny.num_layers": [1, 1024]},
                "steps": 1,
            }
        )
    )
    return {
        "prompt-1m-chars-past-the-positions": (
            ["run", "--set", f"task=jsonl:{long_prompt}", *SMALL, *r],
            f"{long_prompt} line 21: prompt of 1,000,000 tokens + rollout.max_new_tokens 12 "
            "exceeds the model's 512 positions",
            {},
        ),
        "prompt-2m-chars": (
            ["run", "--set", f"task=jsonl:{huge_prompt}", *SMALL, *r],
            f"{huge_prompt} line 21: 'prompt' is 2,000,000 characters; at most 1,048,576",
            {},
        ),
        "task-file-65mib": (
            ["run", "--set", f"task=jsonl:{big_task}", *SMALL, *r],
            f"{big_task}: is 68,157,440 bytes; a task file may be at most 67,108,864 bytes (64 MiB; "
            "raise task_options.max_file_mib for more)",
            {},
        ),
        "run-yaml-200mb": (
            ["run", str(big_run), *SMALL, *r],
            f"{big_run}: is 200,000,000 bytes; a run or experiment file may be at most 1,048,576",
            {},
        ),
        "experiment-yaml-200mb": (
            ["ablate", str(big_exp), *r],
            f"{big_exp}: is 200,000,000 bytes; a run or experiment file may be at most 1,048,576",
            {},
        ),
        "chat-template-2mib": (
            ["run", "--set", f"rollout.chat_template={big_template}", *SMALL, *r],
            f"rollout.chat_template: {big_template}: is 2,097,152 bytes; a chat template may be "
            "at most 1,048,576 bytes (1 MiB)",
            {},
        ),
        "config-json-5mib": (
            ["run", "--set", f"model={padded}", *SMALL, *r],
            "config.json may be at most 4,194,304 bytes",
            {},
        ),
        "vocab-size-1e9": (
            [
                "run",
                "--set",
                f"model={model_dir(tmp, 'vocab', qwen, vocab_size=10**9)}",
                *SMALL,
                *r,
            ],
            "(config.json: vocab_size 1000000000, hidden_size 32, num_hidden_layers 2): needs at "
            "least 1,024.0 GB (64,000,018,720 parameters x 4 bytes x 4 (weights+grads+AdamW)) but "
            "this machine has ",
            {},
        ),
        "hidden-size-1e6": (
            [
                "run",
                "--set",
                f"model={model_dir(tmp, 'wide', qwen, hidden_size=10**6, head_dim=16)}",
                *SMALL,
                *r,
            ],
            "hidden_size 1000000, num_hidden_layers 2): needs at least 19.5 GB",
            {},
        ),
        "layers-1e5": (
            [
                "run",
                "--set",
                f"model={model_dir(tmp, 'deep', qwen, num_hidden_layers=10**5, layer_types=None)}",
                *SMALL,
                *r,
            ],
            "num_hidden_layers 100000 is more than the 1024 layers the harness builds",
            {},
        ),  # fmt: skip
        "tiny-hidden-65536": (
            ["run", "--set", "tiny.hidden_size=65536", *SMALL, *r],
            "tiny (hidden_size 65536, num_layers 2, intermediate_size 256): needs at least 551.6 GB",
            {},
        ),
        "grid-width-times-depth": (
            ["ablate", str(grid), *r],
            "grid: cell 'hidden_size=2048 num_layers=1024': tiny (hidden_size 2048, num_layers "
            "1024, intermediate_size 64): needs at least",
            {},
        ),
        # Last: a regression here hangs, and the child's timeout must not cost the others.
        "chat-template-nested-range-loops": (
            ["run", "--set", f"rollout.chat_template={loop}", *SMALL, *r],
            "rollout.chat_template: rendering the probed prompts took more than 1 s",
            {"TEMPLATE_RENDER_SECONDS": 1.0},
        ),
    }


SIZE_CASES = [
    "prompt-1m-chars-past-the-positions",
    "prompt-2m-chars",
    "task-file-65mib",
    "run-yaml-200mb",
    "experiment-yaml-200mb",
    "chat-template-2mib",
    "config-json-5mib",
    "vocab-size-1e9",
    "hidden-size-1e6",
    "layers-1e5",
    "tiny-hidden-65536",
    "grid-width-times-depth",
    "chat-template-nested-range-loops",
]


@pytest.fixture(scope="module")
def size_results(tmp_path_factory: pytest.TempPathFactory, qwen_dir: Path) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("size")
    cases = _size_cases(tmp, qwen_dir)
    assert list(cases) == SIZE_CASES
    batch = run_batch_under_memory_limit(
        tmp, {n: [argv, patch] for n, (argv, _, patch) in cases.items()}
    )
    return {"cases": cases, "tmp": tmp, **batch}


@pytest.mark.parametrize("case", SIZE_CASES)
def test_size_case_is_one_line_under_a_memory_limit(case, size_results):
    _, expect, _ = size_results["cases"][case]
    got = size_results["got"].get(case)
    assert got is not None, (
        f"no result (the child died at or before this case): {size_results['tail']}"
    )
    assert got["exception"] is None, got["exception"]
    assert_one_line(got["exit_code"], got["stderr"], expect, size_results["tmp"] / "results")
    assert got["seconds"] < 120, got["seconds"]


# --- the rest of the corpus: safe to run in this process ------------------------------------------


def _nopad_dir(tmp: Path, qwen: Path) -> Path:
    """The model with a tokenizer that has neither pad nor eos (transformers then adds a default
    eos one past the 320-token vocabulary)."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = model_dir(tmp, "nopad", qwen)
    for f in [*path.glob("tokenizer*"), *path.glob("special_tokens*")]:
        f.unlink()
    backend = AutoTokenizer.from_pretrained(qwen).backend_tokenizer
    bare = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(backend.to_str()))
    bare.save_pretrained(path)
    return path


def _write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def _empty_prompt_row(tmp: Path, _: Path) -> tuple[list[str], str]:
    row = b'{"prompt": "", "answer": "1"}\n'
    data = write_jsonl(tmp / "e.jsonl", rows(), {6: row})
    return ["--set", f"task=jsonl:{data}"], f"{data} line 6: 'prompt' is empty"


def _invalid_utf8_row(tmp: Path, _: Path) -> tuple[list[str], str]:
    row = b'{"prompt": "\xff", "answer": "1"}\n'
    data = write_jsonl(tmp / "u.jsonl", rows(), {4: row})
    return [
        "--set",
        f"task=jsonl:{data}",
    ], f"{data} line 4: is not valid UTF-8 (byte 12 of the line)"


def _python_examples_empty_prompt(tmp: Path, _: Path) -> tuple[list[str], str]:
    mod = _write(
        tmp / "user_task.py",
        "def score(prompt, completion, answer):\n    return 0.0\n\n\n"
        "def examples():\n    return [{'prompt': 'a=', 'answer': 'b'}, {'prompt': '', 'answer': 'c'}]\n",
    )
    return ["--set", f"task=python:{mod}:score"], "examples() item 2: 'prompt' is empty"


def _template(
    name: str, content: str | bytes, expect: str
) -> Callable[[Path, Path], tuple[list[str], str]]:
    def build(tmp: Path, _: Path) -> tuple[list[str], str]:
        path = _write(tmp / name, content)
        return ["--set", f"rollout.chat_template={path}"], expect.replace("{path}", str(path))

    return build


def _no_weights(tmp: Path, qwen: Path) -> tuple[list[str], str]:
    path = model_dir(tmp, "noweights", qwen)
    (path / "model.safetensors").unlink()
    return (
        ["--set", f"model={path}"],
        f"model: directory '{path}' has no weights (expected model.safetensors, "
        "model-*.safetensors or pytorch_model.bin)",
    )


def _no_pad_no_eos(tmp: Path, qwen: Path) -> tuple[list[str], str]:
    return (
        ["--set", f"model={_nopad_dir(tmp, qwen)}"],
        "gives pad_token '<|endoftext|>' id 320, outside the model's 320-token vocabulary",
    )


def _long_answer_warm_start(tmp: Path, _: Path) -> tuple[list[str], str]:
    data = write_jsonl(tmp / "a.jsonl", [*rows(), {"prompt": "1=", "answer": "9" * 600}])
    return (
        ["--set", f"task=jsonl:{data}", "--set", "warm_start.steps=1"],
        f"warm_start.steps: task 'jsonl:{data}': {data} line 51: prompt '1=' + its "
        "demonstration + EOS is 603 tokens, more than the model's 512 positions",
    )


HOSTILE: dict[str, Callable[[Path, Path], tuple[list[str], str]]] = {
    "empty-prompt-row": _empty_prompt_row,
    "invalid-utf8-row": _invalid_utf8_row,
    "python-examples-empty-prompt": _python_examples_empty_prompt,
    "empty-chat-template": _template(
        "e.jinja", " \n", "rollout.chat_template: {path}: is empty (use none for plain prompts)"
    ),
    "chat-template-not-utf8": _template(
        "b.jinja", b"{{ x }}\xff", "rollout.chat_template: {path}: is not valid UTF-8 (byte 7)"
    ),
    "chat-template-renders-nothing": _template(
        "n.jinja",
        "{% if false %}x{% endif %}",
        "the chat template renders it as no tokens (a prompt must be at least one token)",
    ),
    "model-dir-without-weights": _no_weights,
    "tokenizer-without-pad-and-eos": _no_pad_no_eos,
    "answer-too-long-for-the-warm-start": _long_answer_warm_start,
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_input_is_one_line(case, tmp_path, qwen_dir):
    argv, expect = HOSTILE[case](tmp_path, qwen_dir)
    results = tmp_path / "results"
    # SMALL: should validation regress, the run that follows is short and the test fails fast
    r = CliRunner().invoke(app, ["run", *argv, *SMALL, "--results-dir", str(results)])
    assert_one_line(r.exit_code, r.stderr if r.stderr is not None else r.output, expect, results)


def test_the_long_answer_is_fine_without_the_warm_start(tmp_path):
    """The warm-start bound is about the warm start: rollouts only need prompt + max_new_tokens."""
    from harness.config import load_run_config

    data = write_jsonl(tmp_path / "a.jsonl", [*rows(), {"prompt": "1=", "answer": "9" * 600}])
    cfg = load_run_config(None, [f"task=jsonl:{data}"])
    assert cfg.warm_start.steps == 0


# --- targeted ----------------------------------------------------------------------------------


def test_parameter_count_from_the_config_equals_the_built_model(qwen_dir):
    """Meta-device count, extrapolated from one and two layers, is exact for uniform stacks."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config

    from harness.config import build_run_config
    from harness.config.resources import count_params, tiny_model_config
    from harness.model.build import build_model, build_tokenizer

    for tiny in ({}, {"num_layers": 7, "hidden_size": 64, "num_heads": 2}):
        cfg = build_run_config({"tiny": tiny})
        built = build_model(build_tokenizer(), cfg.tiny)
        assert count_params(tiny_model_config(cfg)) == sum(p.numel() for p in built.parameters())
    qwen = AutoConfig.from_pretrained(qwen_dir)
    qwen.num_hidden_layers = 5
    qwen.layer_types = qwen.layer_types[:1] * 5
    gpt2 = GPT2Config(n_embd=32, n_layer=5, n_head=2, vocab_size=300, n_positions=64)
    for config in (qwen, gpt2):
        with torch.random.fork_rng(devices=[]):
            real = AutoModelForCausalLM.from_config(config)
        assert count_params(config) == sum(p.numel() for p in real.parameters()), type(config)


def test_deep_and_wide_configs_cost_nothing_to_count():
    from transformers import LlamaConfig

    from harness.config.resources import MAX_LAYERS, count_params

    start = time.monotonic()
    wide = LlamaConfig(vocab_size=10**9, hidden_size=10**6, intermediate_size=64,
                       num_hidden_layers=MAX_LAYERS, num_attention_heads=2)  # fmt: skip
    n = count_params(wide)
    assert n > 2 * 10**15  # the embedding and head alone
    assert time.monotonic() - start < 10
    with pytest.raises(ValueError, match="num_hidden_layers 1025 is more than the 1024"):
        count_params(LlamaConfig(num_hidden_layers=MAX_LAYERS + 1))
    from transformers import T5Config

    with pytest.raises(ValueError, match=r"cannot build a causal LM from this config \(ValueError"):
        count_params(T5Config(num_layers=2))  # an encoder-decoder: loading would fail too


def test_available_memory_sees_the_address_space_limit():
    code = (
        "from harness.config.resources import _rlimit_available, available_memory\n"
        "(n, _), (r, why) = available_memory(), _rlimit_available(); print(n, r, why, sep='|')\n"
    )
    limit = 2_000_000_000

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=cap,
        capture_output=True,
        text=True,
        # Against a hang only: the child imports torch (9 s idle, past 60 s beside six busy
        # processes); run() returns as soon as it has printed.
        timeout=600,
        check=True,
    ).stdout.strip()
    n, r, why = out.split("|")
    assert 0 < int(n) <= int(r) < limit  # the smallest bound wins
    assert why == "address-space limit (ulimit -v) left"


def test_memory_check_counts_the_copies_a_run_holds():
    from harness.config import build_run_config
    from harness.config.resources import training_copies

    assert training_copies(build_run_config({})) == (4, "weights+grads+AdamW")
    kl = build_run_config({"ppo": {"kl_ctl": 0.1}, "rollout": {"staleness": 2}})
    assert training_copies(kl) == (
        4 + 1 + 4,
        "weights+grads+AdamW + reference + 4 staleness snapshots",
    )
    lora = build_run_config({"model_options": {"lora": {"r": 4}}, "ppo": {"kl_ctl": 0.1}})
    assert training_copies(lora) == (1, "weights (LoRA)")


def test_memory_check_can_be_switched_off_but_not_the_layer_bound(monkeypatch):
    from harness.config import build_run_config
    from harness.config.resources import check_model_memory

    wide = build_run_config({"tiny": {"hidden_size": 65536}})
    with pytest.raises(ValueError, match="needs at least 551.6 GB"):
        check_model_memory(wide)
    monkeypatch.setenv("HARNESS_MEMORY_CHECK", "off")
    assert check_model_memory(wide) == 34_473_836_544
    deep = build_run_config({"tiny": {"num_layers": 1024}})
    assert check_model_memory(deep) > 0  # the tiny bound is the same 1024


def test_probe_tokenizes_one_prompt_at_a_time(tmp_path):
    from harness.config import build_run_config
    from harness.config.prompt_probe import probe_prompts
    from harness.model.build import build_tokenizer
    from harness.tasks import get_task

    data = write_jsonl(tmp_path / "d.jsonl", [*rows(), {"prompt": "x" * 3000 + "=", "answer": "1"}])
    cfg = build_run_config({"task": f"jsonl:{data}"})
    task = get_task(cfg.task)
    real = build_tokenizer()
    calls: list[int] = []

    def one(text: Any, **kw: Any) -> Any:
        assert isinstance(text, str), type(text)  # never a batch: no padding to the longest
        calls.append(len(text))
        return real(text, **kw)

    probe = probe_prompts(cfg, task, one)
    longest, ex = probe.top["prompt"]
    assert longest == 3001 and ex.source == f"{data} line 51"  # found though never sampled
    assert len(calls) == len({(e.prompt, e.answer) for e in [*task.train, *task.held_out]})


def test_time_bound_stops_a_loop_and_restores_an_outer_timer():
    from harness.core.limits import RenderTimeout, time_bound

    seen: list[int] = []
    old = signal.signal(signal.SIGALRM, lambda *_: seen.append(1))
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        start = time.monotonic()
        with pytest.raises(RenderTimeout), time_bound(0.2):
            while True:
                pass
        assert time.monotonic() - start < 5
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 20 < left <= 30  # the outer timer runs on, less the time spent inside
        assert signal.getsignal(signal.SIGALRM) is not None and not seen
        with time_bound(5.0):
            pass  # a quick block leaves nothing armed but the outer timer
        assert 20 < signal.getitimer(signal.ITIMER_REAL)[0] <= 30
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_an_outer_time_bound_that_ends_first_ends_an_inner_block_with_its_own_error():
    from harness.core.limits import time_bound

    class Outer(BaseException):
        pass

    class Inner(BaseException):
        pass

    start = time.monotonic()
    with pytest.raises(Outer), time_bound(0.3, Outer):
        with time_bound(30.0, Inner):  # a longer inner bound must not stretch the outer one
            while True:
                pass
    assert time.monotonic() - start < 10
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0  # nothing left armed
    with pytest.raises(Inner), time_bound(30.0, Outer):
        with time_bound(0.2, Inner):  # the tighter inner bound still wins
            while True:
                pass
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0


def test_a_cpu_time_bound_stops_a_loop_and_leaves_a_profilers_timer_alone():
    from harness.core.limits import time_bound

    class Spent(BaseException):
        pass

    end = time.process_time() + 60
    with pytest.raises(Spent), time_bound(0.2, Spent, cpu=True):
        while time.process_time() < end:
            pass
    assert time.process_time() < end
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGPROF) == signal.SIG_DFL

    samples: list[int] = []

    def sample(*_: object) -> None:
        samples.append(1)

    old = signal.signal(signal.SIGPROF, sample)
    signal.setitimer(signal.ITIMER_PROF, 0.01, 0.01)  # a sampling profiler's timer
    try:
        end = time.process_time() + 0.5
        with time_bound(0.1, Spent, cpu=True):  # runs unbounded beside it
            while time.process_time() < end:
                pass
        assert samples and signal.getsignal(signal.SIGPROF) is sample
        assert signal.getitimer(signal.ITIMER_PROF)[1] == pytest.approx(0.01)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


QUOTED = ['it\'s "x"', 'it_s "x"', 'it\'s "x"%', "a\\'b\"", "a%'b\"_", "plain", "it's"]


@pytest.fixture(scope="module")
def sqlite_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    # One database for the module: creating MLflow's schema takes seconds on a loaded machine.
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def tracker(request, tmp_path):
    from harness.tracking import MemoryTracker
    from harness.tracking.mlflow_tracker import MlflowTracker

    if request.param == "memory":
        return MemoryTracker()
    if request.param == "sqlite":
        uri = request.getfixturevalue("sqlite_uri")
    else:
        uri = request.getfixturevalue("pg").create_database(f"mlflow_{uuid.uuid4().hex[:8]}")
    return MlflowTracker(uri, artifact_location=tmp_path / "artifacts")


def test_find_run_matches_values_with_both_quote_kinds_exactly(tracker):
    """MLflow's filter grammar cannot escape a quote; the LIKE fallback must neither miss a run
    nor return a look-alike ('_' and '%' are wildcards, '\\' escapes in PostgreSQL's LIKE)."""
    exp = f"q-{uuid.uuid4().hex[:8]}"
    ids = {}
    for value in QUOTED:
        ids[value] = tracker.start_run(experiment=exp, run_name="r", tags={"cell": value, "k": "1"})
    for value in QUOTED:
        assert tracker.find_run(exp, {"cell": value, "k": "1"}) == ids[value], value
    assert tracker.find_run(exp, {"cell": 'it\'s "y"', "k": "1"}) is None
    assert tracker.find_run(exp, {"cell": 'it\'s "x"', "k": "2"}) is None


def test_a_variant_named_with_both_quote_kinds_has_its_orphaned_run_ended(tmp_path, sqlite_uri):
    """A retried trial's worker searches for the cell's earlier run by its label (the crash)."""
    from harness.config.experiment import load_experiment
    from harness.sweep.scheduler.spec import StudySpec
    from harness.sweep.scheduler.trials import child_run_tags
    from harness.tracking.mlflow_tracker import MlflowTracker

    f = tmp_path / "q.yaml"
    variants = {'it\'s "x"': {"ppo.eps_clip": 0.1}, "plain": {"ppo.eps_clip": 0.2}}
    name = f"q-{uuid.uuid4().hex[:8]}"
    f.write_text(yaml.safe_dump({"name": name, "base": TINY_BASE, "grid": {"variant": variants}}))
    spec = StudySpec.from_experiment(load_experiment(f))
    label = 'variant=it\'s "x"'
    assert label in spec.cells
    tracker = MlflowTracker(sqlite_uri, artifact_location=tmp_path / "a")
    rid = tracker.start_run(
        experiment=spec.experiment, run_name="c", tags=child_run_tags(spec, name, label, 0, 0)
    )
    # the call end_orphaned_runs makes for a retried trial of this cell
    key = {"harness.study": name, "ablation.cell": label, "seed": "0"}
    assert tracker.find_run(spec.experiment, key) == rid


@pytest.mark.parametrize("command", [["ablate", "--help"], ["export", "--help"]])
def test_help_says_validation_runs_python_task_code(command):
    r = CliRunner().invoke(app, command, env={"COLUMNS": "200"})
    assert r.exit_code == 0
    assert "python: task modules" in " ".join(r.output.split())

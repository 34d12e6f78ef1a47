"""Misuse that used to end in a traceback mid-run: LoRA targets that match nothing (or a norm
layer), a model directory without a tokenizer, `~` in paths (docs/models.md's own YAML), plus
docs/tasks.md's task examples run as written, `harness fields` output and the sampler/learner gap."""

import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.config import build_run_config, load_run_config
from tests.support.cli import invoke_run
from tests.support.docs import assert_commands_train, doc_block, harness_run_commands
from tests.support.hf_archs import build_bpe_tokenizer, save_arch
from tests.support.tiny import FAST_RUN, TINY, set_flags

ROOT = Path(__file__).resolve().parents[2]
# The pages whose examples run here as written.
PAGES = ("models.md", "tasks.md")


def assert_refused(result, expect: str, tmp_path: Path, before: set) -> None:
    err = result.stderr if result.stderr is not None else result.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert expect in lines[0], lines[0]
    after = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")}
    assert after == before, sorted(map(str, after - before))  # no results dir, no MLflow run


def snapshot(root: Path) -> set:
    return {p.relative_to(root) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    return save_arch("gpt2", tmp_path_factory.mktemp("models"), build_bpe_tokenizer())


# ---------------------------------------------------------------- LoRA target modules


@pytest.mark.parametrize(
    ("targets", "expect"),
    [
        ("[q_proj, qproj]", "'qproj' matches no module of the model (adaptable layers here: "),
        ("[input_layernorm]", "'input_layernorm' matches LlamaRMSNorm 'model.layers.0.input_"),
        ("[mlp]", "'mlp' matches LlamaMLP 'model.layers.0.mlp', which LoRA cannot adapt"),
    ],
    ids=["no-match", "norm-layer", "whole-block"],
)
def test_lora_targets_are_checked_before_anything_is_written(targets, expect, tmp_path):
    before = snapshot(tmp_path)
    r = invoke_run(tmp_path / "results", f"model_options.lora.target_modules={targets}", *FAST_RUN)
    assert_refused(r, f"model_options.lora.target_modules: {expect}", tmp_path, before)
    assert "q_proj" in r.output  # the message lists names that do work


def test_lora_targets_of_a_loaded_model_and_in_a_grid(gpt2_dir, tmp_path):
    before = snapshot(tmp_path)
    args = [
        "run",
        *set_flags(f"model={gpt2_dir}", "model_options.lora.target_modules=[ln_1]", *FAST_RUN),
    ]
    r = CliRunner().invoke(app, [*args, "--results-dir", str(tmp_path / "results")])
    assert_refused(r, "'ln_1' matches LayerNorm 'transformer.h.0.ln_1'", tmp_path, before)
    assert "c_attn" in r.output
    # a valid target of the same model passes the check
    assert load_run_config(
        None, [f"model={gpt2_dir}", "model_options.lora.target_modules=[c_attn]"]
    )
    doc = yaml.safe_load((ROOT / "experiments" / "smoke.yaml").read_text())
    doc["grid"] = {"model_options.lora.target_modules": [["q_proj"], ["q_prj"]]}
    doc.pop("baseline")
    f = tmp_path / "exp.yaml"
    f.write_text(yaml.safe_dump(doc))
    before = snapshot(tmp_path)
    r = CliRunner().invoke(app, ["ablate", str(f), "--results-dir", str(tmp_path / "results")])
    assert_refused(r, "'q_prj' matches no module of the model", tmp_path, before)


def test_check_target_modules_matches_as_peft_does():
    from harness.model.lora import check_target_modules, model_modules

    modules = model_modules("tiny")
    assert next(iter(modules.values())).lm_head.weight.device.type == "meta"  # nothing allocated
    for ok in (["q_proj", "v_proj"], ["self_attn.q_proj"], ["model.layers.0.mlp.up_proj"]):
        check_target_modules(ok, modules)
    check_target_modules(["all-linear"], {})  # peft resolves it itself
    with pytest.raises(ValueError, match="'proj' matches no module"):
        check_target_modules(["proj"], modules)  # a suffix must be whole name components


# ---------------------------------------------------------------- a model without a tokenizer


def test_model_directory_with_weights_but_no_tokenizer(gpt2_dir, tmp_path):
    model = tmp_path / "no-tokenizer"
    model.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(gpt2_dir / name, model / name)
    before = snapshot(tmp_path)
    r = invoke_run(tmp_path / "results", f"model={model}", *FAST_RUN)
    assert_refused(
        r, f"model: cannot load a tokenizer from '{model}' (no tokenizer", tmp_path, before
    )


# ---------------------------------------------------------------- ~ in paths: the docs' YAML


def test_the_readme_model_yaml_runs_as_written(docs_qwen, memory_tracker):
    """`model: ~/models/...` and `task: jsonl:my-questions.jsonl` (relative to the current
    directory) resolve as docs/models.md says; a tiny Qwen2 with a chat template stands in."""
    Path("my-questions.jsonl").write_text(doc_block('{"prompt"', PAGES))
    text = doc_block("# my-model.yaml", PAGES)
    assert "model: ~/models/" in text and "task: jsonl:my-questions.jsonl" in text
    Path("my-model.yaml").write_text(text)  # the YAML's 448 + 64 tokens fit the model

    cfg = load_run_config("my-model.yaml")
    assert cfg.model == str(docs_qwen) and cfg.model_options.lora is not None
    tracker = memory_tracker
    fast = [s for s in FAST_RUN if not s.startswith("tiny.")]
    r = CliRunner().invoke(app, ["run", "my-model.yaml", *set_flags(*fast, "steps=1")])
    assert r.exit_code == 0, r.output
    (run,) = tracker.runs.values()
    assert run.status == "FINISHED" and run.params["model"] == str(docs_qwen)


def test_tilde_is_expanded_in_every_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "q.jsonl").write_text(
        '{"prompt": "1+1=", "answer": 2}\n{"prompt": "2+2=", "answer": 4}\n'
    )
    (tmp_path / "r.py").write_text("def f(prompt, completion, answer):\n    return 1.0\n")
    (tmp_path / "t.jinja").write_text("{{ messages[0]['content'] }}")
    base = {"tiny": TINY}
    assert build_run_config(
        base, {"rollout.chat_template": "~/t.jinja"}
    ).rollout.chat_template == str(tmp_path / "t.jinja")
    for task in ("jsonl:~/q.jsonl", "python:~/r.py:f@~/q.jsonl"):
        cfg = load_run_config(None, [f"task={task}", *FAST_RUN])  # validate_task reads the files
        assert cfg.task == task
    from harness.tasks import get_task

    assert len(get_task("jsonl:~/q.jsonl").held_out) == 1


# ---------------------------------------------------------------- docs/tasks.md's examples


def test_the_readme_task_examples_run_as_written(tmp_path, monkeypatch, memory_tracker):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-questions.jsonl").write_text(doc_block('{"prompt"', PAGES))
    (tmp_path / "my_reward.py").write_text(doc_block("# my_reward.py", PAGES))
    commands = harness_run_commands(doc_block("# with my_reward.py", PAGES))
    assert len(commands) == 3
    tracker = memory_tracker
    # a 2-step warm start for the documented 200
    runs = assert_commands_train(commands, [*FAST_RUN, "warm_start.steps=2"], tracker)
    assert [run.params["task"] for run in runs] == [
        "jsonl:my-questions.jsonl",
        "python:my_reward.py:score",
        "python:my_reward.py:score@my-questions.jsonl",
    ]
    import importlib.util

    spec = importlib.util.spec_from_file_location("readme_reward", tmp_path / "my_reward.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (mod.score("2+3=", "5", "5"), mod.score("2+3=", "7", "5"), mod.score("", "x", "5")) == (
        1.0,
        0.5,
        0.0,
    )
    assert len(mod.examples()) == 100


# ---------------------------------------------------------------- harness fields


def test_fields_piped_prints_whole_names_and_literal_brackets():
    r = CliRunner().invoke(app, ["fields", "model_options.lora"])  # not a terminal
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert (
        "model_options.lora.target_modules\t['all-linear']\tModule names to adapt, e.g. "
        in (lines[-1])
    )
    assert "[q_proj, v_proj]; [all-linear] = every linear layer" in lines[-1]
    assert all(len(ln.split("\t")) == 3 for ln in lines)
    r = CliRunner().invoke(app, ["fields"])
    assert "model_options.gradient_checkpointing\tFalse\t" in r.output


def test_fields_table_on_a_narrow_terminal_keeps_names_and_brackets():
    import io

    from rich.console import Console

    from harness.cli.commands.fields import fields_table

    rows = [
        ("model_options.gradient_checkpointing", "False", "Recompute activations."),
        (
            "model_options.lora.target_modules",
            "['all-linear']",
            "e.g. [q_proj, v_proj]; [all-linear]",
        ),
    ]
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(fields_table(rows))
    text = out.getvalue()
    assert "model_options.gradient_checkpointing" in text and "…" not in text
    assert "['all-linear']" in text and "[q_proj," in text and "[all-linear]" in text


def test_help_texts_keep_their_brackets():
    r = CliRunner().invoke(app, ["ablate", "--help"], env={"COLUMNS": "200"})
    assert "pip install 'harness[ray]'" in r.output


# ---------------------------------------------------------------- the sampler/learner gap


def test_sampler_logprob_gap_is_the_mean_absolute_difference():
    from harness.ppo.actor import sampler_logprob_gap

    behave = torch.tensor([[0.0, -1.0, -2.0, -3.0]])  # token layout; the gap rolls it left
    mask = torch.tensor([[True, True, False, False]])  # predicting layout: tokens 1 and 2
    learner = torch.tensor([[-1.5, -1.0, 9.0, 9.0]])
    gap = sampler_logprob_gap(learner, {"logprobs": behave, "mask": mask})
    assert gap == pytest.approx((0.5 + 1.0) / 2)
    assert math.isnan(
        sampler_logprob_gap(learner, {"logprobs": behave, "mask": ~torch.ones_like(mask)})
    )


@pytest.mark.filterwarnings("ignore:clipping is inert")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sampler_logprob_gap_is_logged_every_step(dtype, tmp_path):
    from harness.run.loop import run

    cfg = build_run_config(
        {"tiny": TINY, "model_options": {"dtype": dtype}},
        [*FAST_RUN, "ppo.ppo_n_minibatches=1"],
    )
    res = run(cfg, results_dir=tmp_path)
    gaps = res.history["policy/sampler_logprob_gap"]
    assert len(gaps) == 2 and all(0.0 <= g < (1e-5 if dtype == "float32" else 1e-2) for g in gaps)
    # one optimizer step on fresh data: the gap is the mean |log r| of that update, so it bounds
    # the signed k1 mean and is bounded by the largest |log r|
    for g, k1, lo, hi in zip(
        gaps,
        res.history["policy/approx_kl_k1"],
        res.history["policy/ratio_min"],
        res.history["policy/ratio_max"],
        strict=True,
    ):
        assert abs(k1) <= g + 1e-9
        assert g <= max(abs(math.log(lo)), abs(math.log(hi))) + 1e-9

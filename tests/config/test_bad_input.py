"""Bad input corpus: every malformed experiment file or command line gets exit code 2, one line
naming the field and what is allowed, no traceback, and nothing written to any store."""

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from tests.support.tiny import TINY

BASE = {
    "task": "reverse",
    "tiny": TINY,
    "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 4},
    "eval": {"every": 0, "n_prompts": 4},
}


def exp(**kw):
    doc = {
        "name": "bad",
        "base": BASE,
        "grid": {"ppo.eps_clip": [0.1, 0.2]},
        "seeds": 1,
        "steps": 2,
    }
    doc.update(kw)
    return {k: v for k, v in doc.items() if v is not None}


def with_base(**over):
    b = yaml.safe_load(yaml.safe_dump(BASE))
    for k, v in over.items():
        cur = b
        parts = k.split(".")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = v
    return b


CASES = {
    "unknown-top-key": (exp(gird={"a": [1]}), "gird: unknown key"),
    "unknown-config-key": (
        exp(base=with_base(**{"ppo.eps_clipp": 0.2})),
        "ppo.eps_clipp: unknown key",
    ),
    "wrong-type": (
        exp(base=with_base(**{"ppo.eps_clip": "wide"})),
        "ppo.eps_clip: must be a number",
    ),
    "eps-clip-zero": (
        exp(grid={"ppo.eps_clip": [0.0, 0.2]}),
        "grid.ppo.eps_clip: value 0.0 rejected: must be a finite number > 0",
    ),
    "eps-clip-higher-negative": (
        exp(grid={"ppo.eps_clip_higher": [-0.1]}),
        "grid.ppo.eps_clip_higher: value -0.1 rejected: must be a finite number >= 0",
    ),
    "c-clip-not-above-one": (
        exp(grid={"ppo.c_clip": [1.0, 3.0]}),
        "grid.ppo.c_clip: value 1.0 rejected: must be a finite number > 1",
    ),
    "cap-not-above-one": (
        exp(
            base=with_base(
                **{"ppo.behave_imp_weight_mode": "token_mask", "ppo.use_decoupled_loss": True}
            ),
            grid={"ppo.behave_imp_weight_cap": [1.0]},
        ),
        "behave_imp_weight_cap: value 1.0 rejected: must be a finite number > 1",
    ),
    "unknown-behave-mode": (
        exp(grid={"ppo.behave_imp_weight_mode": ["token_clip"]}),
        "behave_imp_weight_mode: value 'token_clip' rejected: must be one of",
    ),
    "unknown-norm-level": (
        exp(grid={"adv_norm.mean_level": ["token"]}),
        "mean_level: value 'token' rejected: must be one of 'batch', 'group' or null",
    ),
    "group-size-not-dividing": (
        exp(grid={"reward_norm": [{"mean_level": "group", "std_level": "group", "group_size": 3}]}),
        "group_size 3 must equal rollout.n_samples",
    ),
    "empty-grid": (exp(grid={}), "grid: must be a non-empty mapping"),
    "empty-axis": (exp(grid={"ppo.eps_clip": []}), "must be a non-empty list"),
    "duplicate-axis": (
        exp(grid={"ppo.adv_norm.mean_level": ["batch"], "adv_norm.mean_level": ["group"]}),
        "duplicate axis",
    ),
    "duplicate-values": (exp(grid={"ppo.eps_clip": [0.2, 0.2]}), "duplicate values"),
    "axis-not-a-config-path": (exp(grid={"ppo.clip_eps": [0.2]}), "is not a run-config path"),
    "baseline-not-a-cell": (exp(baseline={"ppo.eps_clip": 0.3}), "baseline"),
    "baseline-axis-unknown": (exp(baseline={"ppo.c_clip": 3}), "is not a grid axis"),
    "unknown-task": (exp(base=with_base(task="multiply")), "task"),
    "missing-model-dir": (
        exp(base=with_base(model="/nonexistent/model")),
        "model: directory '/nonexistent/model' does not exist",
    ),
    "negative-seed": (
        exp(seeds=[0, -1]),
        "seeds[1]: must be an integer in [0, 4_294_967_295]; got -1",
    ),
    "zero-seeds": (exp(seeds=0), "seeds: must be an integer in [1, 10_000]; got 0"),
    "seeds-wrong-type": (
        exp(seeds="three"),
        "seeds: must be an integer or a list or a mapping; got 'three'",
    ),
    "zero-steps": (exp(steps=0), "steps: must be an integer in [1, 10_000_000]; got 0"),
    "bad-metric": (exp(metric="reward"), "metric: 'reward' is not a run-summary key"),
    "bad-direction": (
        exp(direction="up"),
        "direction: must be one of 'maximize', 'minimize'; got 'up'",
    ),
    "variant-clash": (
        exp(grid={"ppo.eps_clip": [0.2], "variant": {"a": {"ppo.eps_clip": 0.3}}}),
        "also a grid axis",
    ),
    "grid-and-search": (
        exp(
            search={
                "n_trials": 2,
                "params": {"ppo.eps_clip": {"type": "float", "low": 0.1, "high": 0.3}},
            }
        ),
        "either grid or search",
    ),
    "rs-and-behave-mode": (
        exp(
            base=with_base(
                **{
                    "ppo.behave_imp_weight_mode": "token_mask",
                    "ppo.rejection_sampling": {"upper": 2.0},
                }
            )
        ),
        "not both",
    ),
    "missing-name": (exp(name=None), "name: must be 1-100 letters, digits"),
    "metric-typo": (exp(metric="final/rewrd"), "did you mean 'final/reward'"),
    "metric-unknown-stability-key": (exp(metric="stability/wobble"), "not a run-summary key"),
    "steps-overflow": (exp(steps=10**23), "steps: must be an integer in [1, 10_000_000]"),
    "steps-float": (exp(steps=1.0e23), "steps: must be an integer"),
    "seeds-huge-count": (exp(seeds=10**9), "seeds: must be an integer in [1, 10_000]"),
    "seed-overflow": (exp(seeds=[0, 2**40]), "seeds[1]: must be an integer in [0, 4_294_967_295]"),
    "eps-clip-inf": (
        exp(grid={"ppo.eps_clip": [float("inf")]}),
        "grid.ppo.eps_clip: value inf rejected: must be a finite number > 0",
    ),
    "eps-clip-higher-nan": (
        exp(grid={"ppo.eps_clip_higher": [float("nan")]}),
        "grid.ppo.eps_clip_higher: value nan rejected: must be a finite number >= 0",
    ),
    "base-lr-nan": (exp(base=with_base(**{"optim.lr": float("nan")})), "base: optim.lr: must be"),
    "search-step-abc": (
        exp(
            grid=None,
            search={
                "n_trials": 2,
                "params": {
                    "ppo.eps_clip": {"type": "float", "low": 0.1, "high": 0.3, "step": "abc"}
                },
            },
        ),
        "search.params.ppo.eps_clip.step: must be a number or null; got 'abc'",
    ),
    "search-choice-bad-not-doubled": (
        exp(
            grid=None,
            search={
                "n_trials": 2,
                "params": {"ppo.c_clip": {"type": "categorical", "choices": [0.5, 3.0]}},
            },
        ),
        "search.params.ppo.c_clip: value 0.5 rejected: must be a finite number > 1",
    ),
    "search-objective-typo": (
        exp(
            grid=None,
            search={
                "n_trials": 2,
                "params": {"ppo.eps_clip": {"type": "float", "low": 0.1, "high": 0.3}},
                "objectives": [{"metric": "best/rewrd", "direction": "maximize"}],
            },
        ),
        "search.objectives[0].metric: 'best/rewrd' is not a run-summary key (did you mean",
    ),
    "search-low-nan": (
        exp(
            grid=None,
            search={
                "n_trials": 2,
                "params": {"ppo.eps_clip": {"type": "float", "low": float("nan"), "high": 0.3}},
            },
        ),
        "search.params.ppo.eps_clip",
    ),
    "negative-staleness": (
        exp(grid={"rollout.staleness": [-1]}),
        "rollout.staleness: value -1 rejected: must be an integer in [0, 10_000]",
    ),
}


@pytest.fixture
def runner():
    return CliRunner()


def assert_clean_failure(result, expect: str, results: Path) -> None:
    err = result.stderr if result.stderr is not None else result.output
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output and "Traceback" not in (err or "")
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    assert expect in lines[0], lines[0]
    # nothing written: no Optuna journal, no MLflow database
    if results.exists():
        assert not (results / "optuna-journal.log").exists()
        assert not (results / "mlflow.db").exists()


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_experiment_file(case, tmp_path, runner):
    doc, expect = CASES[case]
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(doc))
    results = tmp_path / "results"
    command = "search" if "search" in doc and "grid" not in doc else "ablate"
    result = runner.invoke(app, [command, str(f), "--results-dir", str(results)])
    assert_clean_failure(result, expect, results)
    assert not results.exists()
    assert ".ppo.c_clip.ppo.c_clip" not in result.output  # a path is never repeated


def test_duplicate_keys_are_refused(tmp_path, runner):
    f = tmp_path / "dup.yaml"
    f.write_text(
        "name: dup\nbase: {task: reverse}\ngrid: {ppo.eps_clip: [0.1]}\nsteps: 2\nsteps: 500\n"
    )
    r = runner.invoke(app, ["ablate", str(f), "--results-dir", str(tmp_path / "r")])
    assert_clean_failure(r, "duplicate key 'steps' (first on line 4)", tmp_path / "r")
    g = tmp_path / "dup-run.yaml"
    g.write_text("ppo:\n  eps_clip: 0.1\n  eps_clip: 0.3\n")
    r = runner.invoke(app, ["run", str(g), "--results-dir", str(tmp_path / "r")])
    assert_clean_failure(r, "duplicate key 'eps_clip'", tmp_path / "r")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "content", [bytes(range(256)) * 4, b"\x89PNG\r\n\x1a\n\x00\x00", b"name: x\x00\n"]
)
def test_binary_experiment_file_is_one_line(content, tmp_path, runner):
    f = tmp_path / "exp.yaml"
    f.write_bytes(content)
    for cmd in ("ablate", "run"):
        r = runner.invoke(app, [cmd, str(f), "--results-dir", str(tmp_path / "r")])
        assert_clean_failure(r, "expected a YAML file", tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_malformed_jsonl_task(tmp_path, runner):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=" \n')
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(exp(base=with_base(task=f"jsonl:{data}"))))
    result = runner.invoke(app, ["ablate", str(f), "--results-dir", str(tmp_path / "r")])
    assert_clean_failure(result, "line 2", tmp_path / "r")


def test_invalid_yaml_and_missing_file(tmp_path, runner):
    f = tmp_path / "bad.yaml"
    f.write_text("name: x\ngrid: [unclosed\n")
    assert_clean_failure(
        runner.invoke(app, ["ablate", str(f), "--results-dir", str(tmp_path / "r")]),
        "not valid YAML",
        tmp_path / "r",
    )
    assert_clean_failure(
        runner.invoke(
            app, ["ablate", str(tmp_path / "nope.yaml"), "--results-dir", str(tmp_path / "r")]
        ),
        "file not found",
        tmp_path / "r",
    )


@pytest.mark.parametrize(
    "args,expect",
    [
        (
            ["--storage", "postgresql://harness:s3cret@127.0.0.1:1/nodb"],
            "cannot connect to postgresql://harness:***@127.0.0.1:1/nodb",
        ),
        (["--storage", "redis://localhost"], "--storage: scheme 'redis' is not supported"),
        (
            ["--tracking-uri", "ftp://example/mlflow"],
            "--tracking-uri: scheme 'ftp' is not supported",
        ),
        (["--workers", "0"], "--workers: must be an integer in [1, 256]"),
        (["--max-retries", "-1"], "--max-retries: must be an integer in [0, 100]"),
        (["--devices", "tpu:0"], "--devices: 'tpu:0' is not cpu, cuda or cuda:N"),
    ],
)
def test_bad_command_lines(args, expect, tmp_path, runner):
    results = tmp_path / "results"
    result = runner.invoke(
        app, ["ablate", "experiments/smoke.yaml", "--results-dir", str(results), *args]
    )
    assert_clean_failure(result, expect, results)
    assert "s3cret" not in result.output


@pytest.mark.parametrize(
    "sets,expect",
    [
        (["ppo.eps_clip=-1"], "--set ppo.eps_clip=-1: must be a finite number > 0; got -1.0"),
        (["seed=-1"], "--set seed=-1: must be an integer in [0, 4_294_967_295]"),
        (["steps=0"], "--set steps=0: must be an integer in [1, 10_000_000]"),
        (["ppo.c_clip=0.5"], "--set ppo.c_clip=0.5: must be a finite number > 1"),
        (["ppo.nope=1"], "--set ppo.nope=1: unknown key"),
        (["task=bogus"], "task"),
        (["device=tpu"], "device must be auto, cpu, cuda or cuda:N"),
        (["adv_norm.std_level=median"], "--set adv_norm.std_level=median: must be one of"),
        (["eps_clip"], "expected KEY=VALUE"),
    ],
)
def test_bad_run_overrides(sets, expect, tmp_path, runner):
    results = tmp_path / "results"
    args = ["run", "experiments/run-default.yaml", "--results-dir", str(results)]
    for s in sets:
        args += ["--set", s]
    assert_clean_failure(runner.invoke(app, args), expect, results)


# --- every numeric field is checked from its declaration (harness.core.fields.meta) ----------------

from harness.config import RunConfig  # noqa: E402
from harness.core.configtools import check_declared  # noqa: E402
from harness.core.fields import declared_fields, field_defaults  # noqa: E402

NUMERIC = {
    path: (tp, md) for path, (tp, md) in declared_fields(RunConfig).items() if tp in (int, float)
}


def test_every_numeric_field_declares_its_range_and_its_default_fits():
    assert len(NUMERIC) > 40  # the walk reaches nested and optional sub-configs
    defaults = field_defaults(RunConfig)
    for path, (tp, md) in NUMERIC.items():
        assert md.get("help"), path
        if tp is int:  # bound every integer, or 10**23 overflows mid-run
            assert md.get("ge", md.get("gt")) is not None, f"{path}: no lower bound"
            assert md.get("le", md.get("lt")) is not None, f"{path}: no upper bound"
        if defaults[path] is not None:
            check_declared(defaults[path], md, path)  # raises if a default is out of range


def _bad_values(tp, md):
    """Values every numeric field must refuse: NaN and overflow for all; ±inf for floats unless
    the field documents what inf means; the value just past each declared bound."""
    out = [".nan"] if tp is float else ["100000000000000000000000", "1.5"]
    if tp is float and not md.get("inf"):
        out += [".inf", "-.inf", "1e400"]
    for key in ("ge", "gt"):
        if md.get(key) is not None:
            out.append(str(md[key] - 1) if tp is int else str(md[key] - 0.5))
            if key == "gt":
                out.append(str(md[key]))
    for key in ("le", "lt"):
        if md.get(key) is not None:
            out.append(str(md[key] + 1) if tp is int else str(md[key] + 0.5))
            if key == "lt":
                out.append(str(md[key]))
    return out


@pytest.mark.parametrize("path", sorted(NUMERIC))
def test_every_numeric_field_refuses_out_of_range_values_on_the_command_line(
    path, tmp_path, runner
):
    tp, md = NUMERIC[path]
    results = tmp_path / "results"
    for value in _bad_values(tp, md):
        r = runner.invoke(app, ["run", "--set", f"{path}={value}", "--results-dir", str(results)])
        assert_clean_failure(r, f"--set {path}={value}: must be ", results)
        assert not results.exists()


def test_inf_is_accepted_only_where_the_field_says_what_it_means(tmp_path):
    from harness.config import build_run_config

    cfg = build_run_config({"ppo": {"reward_clip": float("inf")}})
    assert cfg.ppo.reward_clip == float("inf")
    assert "(.inf = no clipping)" in field_help_line("ppo.reward_clip")


def field_help_line(path):
    from harness.core.configtools import ConfigError

    try:
        check_declared(float("nan"), NUMERIC[path][1], path)
    except ConfigError as err:
        return str(err)
    raise AssertionError("NaN accepted")


# --- command lines: names, usage errors, devices, read-only commands, stores ------------------


def assert_nothing_written(root: Path, before: set) -> None:
    after = {p.relative_to(root) for p in root.rglob("*")}
    assert after == before, sorted(map(str, after - before))


def snapshot(root: Path) -> set:
    return {p.relative_to(root) for p in root.rglob("*")}


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--workers", "abc"], "--workers: must be an integer"),
        (["--max-retries", "x"], "--max-retries: must be an integer"),
        (["--wrkers", "2"], "No such option: --wrkers"),
        (["--study-name", "../../escaped"], "--study-name: must be 1-100 letters"),
        (["--study-name", "/tmp/escaped"], "--study-name: must be 1-100 letters"),
        (["--study-name", ".."], "--study-name: must be 1-100 letters"),
        (["--study-name", "x" * 500], "(500 characters)"),
        (["--devices", "cuda:99"], "--devices: 'cuda:99' requested but"),
        (["--tracking-uri", "http://127.0.0.1:9/"], "tracking_uri: cannot connect to"),
    ],
)
def test_bad_ablate_command_lines_write_nothing(args, expect, tmp_path, runner):
    results = tmp_path / "results"
    before = snapshot(tmp_path)
    r = runner.invoke(
        app, ["ablate", "experiments/smoke.yaml", "--results-dir", str(results), *args]
    )
    assert_clean_failure(r, expect, results)
    assert_nothing_written(tmp_path, before)
    assert "Usage:" not in r.output and "╭" not in r.output


def test_search_refuses_a_traversing_study_name(tmp_path, runner):
    r = runner.invoke(
        app,
        [
            "search",
            "experiments/search.yaml",
            "--study-name",
            "../up",
            "--results-dir",
            str(tmp_path / "r"),
        ],
    )
    assert_clean_failure(r, "--study-name: must be 1-100 letters", tmp_path / "r")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("name", ["..", "../escaped", "a/b", "x" * 500, ".hidden", ""])
def test_experiment_names_that_are_not_one_safe_path_component(name, tmp_path, runner):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(exp(name=name)))
    r = runner.invoke(app, ["ablate", str(f), "--results-dir", str(tmp_path / "r")])
    assert_clean_failure(r, "name: must be 1-100 letters", tmp_path / "r")


def test_run_on_a_missing_gpu_is_one_line(tmp_path, runner):
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 99:  # pragma: no cover
        pytest.skip("this machine has a cuda:99")
    before = snapshot(tmp_path)
    r = runner.invoke(app, ["run", "--set", "device=cuda:99", "--results-dir", str(tmp_path / "r")])
    assert_clean_failure(r, "device: 'cuda:99' requested but", tmp_path / "r")
    assert_nothing_written(tmp_path, before)


@pytest.mark.parametrize(
    "args",
    [
        ["status", "nosuch"],
        ["report", "nosuch"],
        ["worker", "--study", "nosuch"],
        ["status", "nosuch", "--storage", "sqlite:///{tmp}/optuna.db"],
        ["report", "nosuch", "--storage", "sqlite:///{tmp}/optuna.db"],
    ],
)
def test_read_only_commands_on_a_missing_study_create_nothing(args, tmp_path, runner):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    before = snapshot(tmp_path)
    r = runner.invoke(app, [*args, "--results-dir", str(tmp_path / "results")])
    assert_clean_failure(r, "no study named 'nosuch'", tmp_path / "results")
    assert_nothing_written(tmp_path, before)


def test_status_with_no_storage_yet_creates_nothing(tmp_path, runner):
    r = runner.invoke(app, ["status", "--results-dir", str(tmp_path / "results")])
    assert r.exit_code == 0 and "no studies yet" in r.output
    assert list(tmp_path.iterdir()) == []


def test_report_on_a_missing_study_in_an_existing_journal_opens_no_tracker(tmp_path, runner):
    import optuna

    from harness.sweep.stores.storage import make_storage

    results = tmp_path / "results"
    optuna.create_study(study_name="other", storage=make_storage(None, results))
    before = snapshot(tmp_path)
    for args in (["report", "nosuch"], ["worker", "--study", "nosuch"]):
        r = runner.invoke(app, [*args, "--results-dir", str(results)])
        assert r.exit_code == 2 and "no study named 'nosuch'" in r.output, r.output
        assert_nothing_written(tmp_path, before)  # no mlflow.db, no lock files


def test_report_refuses_a_traversing_study_argument(tmp_path, runner):
    r = runner.invoke(app, ["report", "../../x", "--results-dir", str(tmp_path / "r")])
    assert_clean_failure(r, "study: must be 1-100 letters", tmp_path / "r")
    assert list(tmp_path.iterdir()) == []


def test_unreachable_postgres_storage_creates_nothing(tmp_path, runner):
    before = snapshot(tmp_path)
    r = runner.invoke(
        app,
        [
            "ablate",
            "experiments/smoke.yaml",
            "--results-dir",
            str(tmp_path / "results"),
            "--storage",
            "postgresql://u:pw@127.0.0.1:1/db",
        ],
    )
    assert_clean_failure(r, "storage: cannot connect to", tmp_path / "results")
    assert_nothing_written(tmp_path, before)


# --- a fresh corpus of careless inputs, written from `harness fields` and the schema ----------

FRESH_RUN = [
    (["task_options.max_len=100000000"], "task_options.max_len: must be an integer in [1, 256]; got 100000000"),
    (["task=add", "task_options.max_operand=1e400"], "task_options.max_operand: must be an integer"),
    (["task=mixed-scale", "task_options.add_fraction=.nan"], "task_options.add_fraction: must be a finite number in [0, 1]; got nan"),
    (["task=add", "task_options.scale=.inf"], "task_options.scale: must be a finite number"),
    (["task_options.min_len=three"], "task_options.min_len: must be an integer"),
    (["adv_norm.mean_level=group", "adv_norm.group_size=3"], "ppo.adv_norm.group_size 3 must equal rollout.n_samples"),
    (["ppo.rejection_sampling.upper=0.5"], ": ppo.rejection_sampling.upper must be > 1"),
    (["tiny.num_heads=3"], ": tiny.hidden_size (128) must be divisible by tiny.num_heads (3)"),
    (["steps="], "--set steps=: must be an integer; got None"),
    (["task_options=5"], "--set task_options=5: must be a mapping"),
    (["ppo.adv_norm=true"], "--set ppo.adv_norm=true: must be a mapping or null"),
    (["model="], "--set model=: must be a string"),
    (["device=CPU"], "device must be auto, cpu, cuda or cuda:N; got 'CPU'"),
    (["ppo.eps_clip=1e-400"], "--set ppo.eps_clip=1e-400: must be a finite number > 0; got 0.0"),
    (["ppo.=1"], "--set ppo.=1: unknown key"),
]  # fmt: skip


@pytest.mark.parametrize("sets,expect", FRESH_RUN)
def test_fresh_corpus_run_overrides(sets, expect, tmp_path, runner):
    args = ["run", "--results-dir", str(tmp_path / "r")]
    for s in sets:
        args += ["--set", s]
    assert_clean_failure(runner.invoke(app, args), expect, tmp_path / "r")
    assert not (tmp_path / "r").exists()
    assert ".rejection_sampling.rejection_sampling" not in expect


def test_model_directory_without_a_tokenizer(tmp_path, runner):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        '{"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,'
        ' "num_attention_heads": 1, "intermediate_size": 8}'
    )
    r = runner.invoke(app, ["run", "--set", f"model={model}", "--results-dir", str(tmp_path / "r")])
    assert_clean_failure(r, f"model: cannot load a tokenizer from '{model}'", tmp_path / "r")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--storage", "sqlite:///"], "--storage: sqlite:///PATH needs a database file path"),
        (["--storage", "sqlite:///{tmp}/no/such/x.db"], "--storage: directory '{tmp}/no/such' does not exist"),
        (["--storage", "sqlite:///{tmp}"], "is a directory"),
        (["--tracking-uri", "sqlite:///"], "--tracking-uri: sqlite:///PATH needs a database file path"),
        (["--tracking-uri", "sqlite:///{tmp}/no/such/m.db"], "--tracking-uri: directory '{tmp}/no/such' does not exist"),
        (["--workers", "100000"], "--workers: must be an integer in [1, 256]; got 100000"),
        (["--max-retries", "1000000000"], "--max-retries: must be an integer in [0, 100]"),
        (["--results-dir", "/dev/null"], "results dir '/dev/null': exists and is not a directory"),
    ],
)  # fmt: skip
def test_fresh_corpus_command_lines(args, expect, tmp_path, runner):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    expect = expect.replace("{tmp}", str(tmp_path))
    before = snapshot(tmp_path)
    extra = [] if "--results-dir" in args else ["--results-dir", str(tmp_path / "results")]
    r = runner.invoke(app, ["ablate", "experiments/smoke.yaml", *args, *extra])
    assert_clean_failure(r, expect, tmp_path / "results")
    assert_nothing_written(tmp_path, before)


# A search over one range with two objectives, for what cannot act on two.
TWO_OBJECTIVES = {
    "n_trials": 2,
    "params": {"optim.lr": {"type": "float", "low": 0.1, "high": 1}},
    "objectives": [
        {"metric": "final/reward"},
        {"metric": "stability/max_drawdown", "direction": "minimize"},
    ],
}

FRESH_EXPERIMENTS = {
    "seed-axis": (exp(grid={"seed": [0, 1]}), "grid: 'seed' cannot vary per cell"),
    "steps-axis": (exp(grid={"steps": [1, 2]}), "grid: 'steps' cannot vary per cell"),
    "variant-sets-seed": (
        exp(grid={"variant": {"a": {"seed": 3}, "b": {"ppo.eps_clip": 0.3}}}),
        "grid.variant.a: 'seed' cannot vary per cell",
    ),
    "search-on-steps": (
        exp(grid=None, search={"n_trials": 2, "params": {"steps": {"type": "int", "low": 1, "high": 9}}}),
        "search.params.steps: 'steps' cannot vary per cell",
    ),
    "search-int-step-float": (
        exp(
            grid=None,
            search={"n_trials": 2, "params": {"rollout.staleness": {"type": "int", "low": 0, "high": 4, "step": 0.5}}},
        ),
        "search.params.rollout.staleness.step: must be an integer in (0, high - low = 4]",
    ),
    "search-int-on-float-field-log-neg": (
        exp(
            grid=None,
            search={"n_trials": 2, "params": {"optim.lr": {"type": "float", "low": -1, "high": 1, "log": True}}},
        ),
        "search.params.optim.lr",
    ),
    "search-n-trials-huge": (
        exp(grid=None, search={"n_trials": 10**9, "params": {"optim.lr": {"type": "float", "low": 0.1, "high": 1}}}),
        "search.n_trials: must be an integer in [1, 100_000]",
    ),
    "search-same-objective-twice": (
        exp(
            grid=None,
            search={
                "n_trials": 2,
                "params": {"optim.lr": {"type": "float", "low": 0.1, "high": 1}},
                "objectives": [{"metric": "final/reward"}, {"metric": "final/reward"}],
            },
        ),
        "search.objectives: names 'final/reward' twice",
    ),
    "search-two-objectives-pruned": (
        exp(
            grid=None,
            search={**TWO_OBJECTIVES, "pruner": "wilcoxon"},
        ),
        "search.pruner: 'wilcoxon' cannot act on a two-objective search (Optuna prunes "
        "single-objective studies only); remove it or set none",
    ),
    "search-two-objectives-raced": (
        exp(
            grid=None,
            seeds={"min": 2, "max": 6},
            search=TWO_OBJECTIVES,
        ),
        "seeds: a racing plan {min, max, ...} compares one objective; a two-objective search "
        "runs every point at every seed (give seeds a count or a list)",
    ),
    "yaml-alias-bomb": (None, "expands to more than 100000 values"),
    "grid-scalar-axis": (exp(grid={"ppo.eps_clip": 0.2}), "must be a non-empty list of values"),
    "seeds-float": (exp(seeds=[0, 0.5]), "seeds[1]: must be an integer; got 0.5"),
    "task-option-huge": (
        exp(base=with_base(task_options={"max_len": 10**12})),
        "base: task_options.max_len: must be an integer in [1, 256]",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(FRESH_EXPERIMENTS))
def test_fresh_corpus_experiment_files(case, tmp_path, runner):
    doc, expect = FRESH_EXPERIMENTS[case]
    f = tmp_path / "bad.yaml"
    if doc is None:  # "billion laughs": 72 aliases standing for 9**9 values
        lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
        for i in range(1, 9):
            prev, cur = chr(96 + i), chr(97 + i)
            lines.append(f"{cur}: &{cur} [{', '.join(['*' + prev] * 9)}]")
        f.write_text("\n".join(lines) + "\nname: bomb\ngrid: {ppo.eps_clip: [*i]}\n")
        doc = {}
    else:
        f.write_text(yaml.safe_dump(doc))
    command = "search" if "search" in doc else "ablate"
    r = runner.invoke(app, [command, str(f), "--results-dir", str(tmp_path / "results")])
    assert_clean_failure(r, expect, tmp_path / "results")
    assert not (tmp_path / "results").exists()

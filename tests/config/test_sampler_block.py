"""``rollout.sampler``: the sampler as one block (backend + its options), and the flat keys it
stands for still working, in files, ``--set`` and grid axes; ``harness fields`` lists both."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli.commands.fields import field_rows
from harness.config import build_run_config, load_run_config
from harness.config.experiment import load_experiment
from harness.core.configtools import ConfigError


def test_the_block_in_a_file_sets_the_flat_fields(tmp_path: Path) -> None:
    f = tmp_path / "run.yaml"
    f.write_text("rollout:\n  sampler: {backend: vllm, kv_cache_gib: 3, dtype: bfloat16}\n")
    r = load_run_config(f).rollout
    assert (r.sampler_backend, r.engine_kv_cache_gib, r.sampler_dtype) == ("vllm", 3, "bfloat16")
    f.write_text("rollout:\n  sampler: {backend: local, decoder: hf, logit_noise: 0.5}\n")
    r = load_run_config(f).rollout
    assert (r.sampler_backend, r.sampler_logit_noise) == ("hf", 0.5)
    f.write_text("rollout:\n  sampler: vllm\n")  # a backend's name alone
    assert load_run_config(f).rollout.sampler_backend == "vllm"


def test_set_either_spelling_and_the_block_wins() -> None:
    r = build_run_config({}, ["rollout.sampler.backend=vllm"]).rollout
    assert r.sampler_backend == "vllm"
    r = build_run_config({}, ["rollout.engine_gpu_memory_utilization=0.4"]).rollout
    assert r.engine_gpu_memory_utilization == 0.4
    # The flat key from the file, the block from --set: the block's value.
    r = build_run_config(
        {"rollout": {"sampler_dtype": "float16"}}, ["rollout.sampler.dtype=bfloat16"]
    ).rollout
    assert r.sampler_dtype == "bfloat16"
    # backend: local keeps a decoder set the flat way; vllm → local goes back to auto.
    r = build_run_config(
        {"rollout": {"sampler_backend": "hf"}}, ["rollout.sampler.backend=local"]
    ).rollout
    assert r.sampler_backend == "hf"
    r = build_run_config(
        {"rollout": {"sampler_backend": "vllm"}}, ["rollout.sampler.backend=local"]
    ).rollout
    assert r.sampler_backend == "auto"


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"backend": "sglang"}, "rollout.sampler.backend: must be one of local, vllm; got 'sglang'"),
        ({"backend": "local", "kv_cache_gib": 2}, "rollout.sampler.kv_cache_gib: an option of backend vllm, not of local"),
        ({"backend": "vllm", "decoder": "hf"}, "rollout.sampler.decoder: an option of backend local, not of vllm"),
        ({"decoder": "slow"}, "rollout.sampler.decoder: must be one of auto, fast, hf; got 'slow'"),
        ({"cache": 1}, "rollout.sampler.cache: unknown key"),
        (3, "rollout.sampler: must be a backend name or a mapping"),
    ],
)  # fmt: skip
def test_a_bad_block_is_one_line_naming_the_field(block: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_run_config({"rollout": {"sampler": block}}, {})
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_a_grid_axis_over_the_block_and_the_flat_key(tmp_path: Path) -> None:
    f = tmp_path / "exp.yaml"
    f.write_text(
        "name: exp\nbase: {steps: 2, task: reverse}\nseeds: [0]\n"
        "grid:\n  rollout.sampler.decoder: [fast, hf]\n  rollout.sampler_logit_noise: [0.0, 0.1]\n"
    )
    spec = load_experiment(f)
    got = sorted((c.label, c.overrides["rollout.sampler.decoder"]) for c in spec.cells)
    assert [g[1] for g in got] == ["fast", "fast", "hf", "hf"]
    cfgs = [build_run_config(spec.base, c.overrides) for c in spec.cells]
    assert sorted((c.rollout.sampler_backend, c.rollout.sampler_logit_noise) for c in cfgs) == [
        ("fast", 0.0), ("fast", 0.1), ("hf", 0.0), ("hf", 0.1),
    ]  # fmt: skip
    f.write_text(
        "name: exp\nbase: {steps: 2}\nseeds: [0]\ngrid:\n  rollout.sampler.cache: [1, 2]\n"
    )
    with pytest.raises(ConfigError, match="not a run-config path"):
        load_experiment(f)


def test_fields_lists_both_spellings() -> None:
    rows = {path: (default, text) for path, default, text in field_rows()}
    for block_key, flat in [
        ("rollout.sampler.backend", "rollout.sampler_backend"),
        ("rollout.sampler.decoder", "rollout.sampler_backend"),
        ("rollout.sampler.dtype", "rollout.sampler_dtype"),
        ("rollout.sampler.logit_noise", "rollout.sampler_logit_noise"),
        ("rollout.sampler.kv_cache_gib", "rollout.engine_kv_cache_gib"),
        ("rollout.sampler.gpu_memory_utilization", "rollout.engine_gpu_memory_utilization"),
    ]:
        assert block_key in rows and flat in rows
        assert flat in rows[block_key][1]
    assert rows["rollout.sampler.kv_cache_gib"][0] == rows["rollout.engine_kv_cache_gib"][0]

"""CLI cases run in ONE child process under an address-space limit (``RLIMIT_AS``, as ``prlimit
--as`` sets it) and a timeout, so a regression fails its case with a ``MemoryError`` instead of
taking the shared machine down; the child reports each case as it finishes (one JSON line), so a
case that kills it still leaves the earlier results.  This file, run as a script, is that child.

Shared by the hostile-input tests (tests/config/test_hostile_input.py, tests/tasks/): the short
run their cases end with and the assertion that a case failed in one line, writing nothing."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from harness.cli import app

ROOT = Path(__file__).resolve().parents[2]
AS_LIMIT = 4_000_000_000  # bytes of address space for the size cases (the machine is shared)
BATCH_TIMEOUT_S = 600
SMALL = [
    "--set", "steps=1", "--set", "eval.n_prompts=2", "--set", "eval.every=0",
    "--set", "rollout.prompts_per_step=1", "--set", "rollout.n_samples=1",
]  # fmt: skip


def assert_one_line(exit_code: int, err: str, expect: str, results: Path) -> None:
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert exit_code == 2, (exit_code, err[-3000:])
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines[0]
    assert expect in lines[0], (expect, lines[0])
    assert not results.exists(), sorted(p.name for p in results.rglob("*"))


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def run_batch_under_memory_limit(
    tmp: Path, spec: dict[str, list[Any]], *, memory_check: bool = True
) -> dict[str, Any]:
    """Run CLI cases ``{name: [argv, limits patch]}`` in one child process under ``AS_LIMIT`` bytes
    of address space (one interpreter start for all cases); return each case's result by name and
    the child's output tail, which says where the child died if a case has no result."""
    spec_path, out = tmp / "cases.json", tmp / "results.jsonl"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if memory_check:
        env.pop("HARNESS_MEMORY_CHECK", None)
    try:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), str(spec_path), str(out)],
            cwd=ROOT,
            env=env,
            preexec_fn=_limit_address_space,
            capture_output=True,
            text=True,
            timeout=BATCH_TIMEOUT_S,
        )
        tail = (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as err:
        tail = f"timed out after {BATCH_TIMEOUT_S} s: {str(err.stderr)[-2000:]}"
    got = {}
    if out.exists():
        for line in out.read_text().splitlines():
            item = json.loads(line)
            got[item["name"]] = item
    return {"got": got, "tail": tail}


def _run_batch(spec_path: str, out_path: str) -> None:
    """The child: each case through the CLI in this process, one JSON line per case."""
    import traceback

    import harness.core.limits as limits

    runner = CliRunner()
    cases = json.loads(Path(spec_path).read_text())
    with open(out_path, "w") as out:
        for name, (argv, patch) in cases.items():
            saved = {k: getattr(limits, k) for k in patch}
            for k, v in patch.items():
                setattr(limits, k, v)
            start = time.monotonic()
            try:
                result = runner.invoke(app, argv)
                exc = None
                if result.exception is not None and not isinstance(result.exception, SystemExit):
                    exc = "".join(traceback.format_exception(result.exception))[-3000:]
                item = {
                    "exit_code": result.exit_code,
                    "stderr": result.stderr if result.stderr is not None else result.output,
                    "exception": exc,
                }
            finally:
                for k, v in saved.items():
                    setattr(limits, k, v)
            item.update(name=name, seconds=time.monotonic() - start)
            out.write(json.dumps(item) + "\n")
            out.flush()


if __name__ == "__main__":
    _run_batch(sys.argv[1], sys.argv[2])

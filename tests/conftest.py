"""Shared fixtures: a private PostgreSQL server and Ray head for the session, local HF model
directories, a scratch results dir, the settings of a tiny two-step run and an in-memory tracker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import tracking
from harness.tracking import MemoryTracker
from tests.support.pg import PrivatePostgres, find_pg_bin
from tests.support.tiny import FAST_RUN


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test`` runs two workers), each worker computes on one thread:
    two workers of two threads each on two cores spend their time contending for them."""
    import os

    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Torch computes on one thread during the test (the count before is restored after): the
    tiny model's matmuls are faster on one, and immune to contention for the cores.  A module
    opts in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def pg() -> Iterator[PrivatePostgres]:
    """A private PostgreSQL 15 server for the whole session; ``pg.restart()`` simulates an outage.

    Tests that need isolation call ``pg.create_database(name)`` for a database of their own.
    The cluster is stopped and deleted at the end of the session, also after failures.
    """
    bin_dir = find_pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found; set HARNESS_PG_BIN")
    server = PrivatePostgres(bin_dir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_url(pg: PrivatePostgres) -> str:
    """``postgresql://postgres:PASSWORD@127.0.0.1:PORT/harness_test`` on the private server."""
    return pg.url


@pytest.fixture
def tmp_results(tmp_path: Path) -> Path:
    """An empty ``results/`` directory for one test."""
    results = tmp_path / "results"
    results.mkdir()
    return results


@pytest.fixture
def tiny_run() -> list[str]:
    """``--set`` values (without the flag) of a two-step run of the tiny model: a later value of
    the same key wins, so a test adds what it needs after these."""
    return list(FAST_RUN)


@pytest.fixture
def memory_tracker(monkeypatch: pytest.MonkeyPatch) -> MemoryTracker:
    """The tracker every run of the test logs to (instead of an MLflow store)."""
    tracker = MemoryTracker()
    monkeypatch.setattr(tracking, "open_tracker", lambda uri, results_dir: tracker)
    return tracker


@pytest.fixture(scope="session")
def ray_private_head() -> Iterator[Any]:
    """A private Ray head (loopback, 2 CPUs) for the session (a ``PrivateRayHead``); stopped at
    the end."""
    pytest.importorskip("ray")
    import os

    from tests.support.ray_head import PrivateRayHead

    old_auth = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # the drivers in this process, as for the head
    head = PrivateRayHead(num_cpus=2)
    head.start()
    try:
        yield head
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        head.stop()
        if old_auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = old_auth


@pytest.fixture(scope="session")
def ray_head(ray_private_head: Any) -> str:
    """The address of the session's private Ray head."""
    return str(ray_private_head.address)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny local HF model (2-layer Qwen2, 320-token byte-level BPE)."""
    from tests.support.hf_archs import build_bpe_tokenizer, save_arch

    return save_arch("qwen2", tmp_path_factory.mktemp("hf"), build_bpe_tokenizer())


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Local model directories of seven architectures (see tests/support/hf_archs.py), built once."""
    from tests.support.hf_archs import ARCHS, build_bpe_tokenizer, save_arch

    root = tmp_path_factory.mktemp("hf_models")
    tok = build_bpe_tokenizer()
    return {name: save_arch(name, root, tok) for name in ARCHS}

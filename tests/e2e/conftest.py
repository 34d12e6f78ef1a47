"""Fixtures of the docs' journeys."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.hf_archs import save_chat_qwen2


@pytest.fixture
def docs_qwen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The docs' ``~/models/qwen2.5-0.5b-instruct``: a tiny Qwen2 with a chat template (1024
    positions: room for the docs' prompt and answer lengths) under a HOME in ``tmp_path``, with
    the current directory an empty ``work/`` beside it; returns the model directory."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    target = home / "models" / "qwen2.5-0.5b-instruct"
    save_chat_qwen2(target, max_position_embeddings=1024)
    return target

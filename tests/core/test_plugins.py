"""A registry package imports every member module but its helpers, in name order, and a broken
member is an error, not a registry that silently lost an entry."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.core.plugins import import_members


def _package(root: Path, name: str, modules: dict[str, str]) -> None:
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("SEEN = []\n")
    for mod, body in modules.items():
        (pkg / f"{mod}.py").write_text(body)


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("plugpkg")]:
        del sys.modules[name]


def test_every_member_but_the_helpers_is_imported_in_name_order(on_path: Path) -> None:
    register = "import plugpkg\nplugpkg.SEEN.append(__name__.rsplit('.', 1)[1])\n"
    _package(on_path, "plugpkg", {"zeta": register, "alpha": register, "helper": register})
    import plugpkg  # type: ignore[import-not-found]

    names = import_members("plugpkg", plugpkg.__path__, skip={"helper"})
    assert names == ["alpha", "zeta"]
    assert plugpkg.SEEN == ["alpha", "zeta"]
    assert "plugpkg.helper" not in sys.modules


def test_a_broken_member_is_an_error(on_path: Path) -> None:
    _package(
        on_path,
        "plugpkg_broken",
        {"good": "X = 1\n", "typo": "raise ValueError('declared twice')\n"},
    )
    import plugpkg_broken  # type: ignore[import-not-found]

    with pytest.raises(ValueError, match="declared twice"):
        import_members("plugpkg_broken", plugpkg_broken.__path__)


def test_the_three_registries_name_no_member() -> None:
    """Objectives, correction families and task sources are found, not listed: each package's
    ``__init__`` holds no member's name."""
    root = Path(__file__).parents[2] / "harness"
    for pkg, members in [
        ("ppo/objectives", ["cispo", "gmpo", "sapo", "vespo"]),
        ("ppo/corrections", ["tis", "mis", "opsm", "gating"]),
        ("tasks/sources", ["csv", "hf", "jsonl", "rg"]),
    ]:
        init = (root / pkg / "__init__.py").read_text()
        assert "import_members(" in init
        for member in members:
            assert f'"{member}"' not in init and f"'{member}'" not in init, (pkg, member)

"""MkDocs hook: the repository files the pages link to become part of the site.

The pages link to files outside ``docs/`` by their repository path (``../results/benchmarks.md``,
``../results/ui/*.png``, ``../experiments/run-default.yaml``), so that the links work where the
Markdown is read in the repository. MkDocs only serves ``docs/``: such a link would be dead on
the built site. This hook adds every such file to the site under its repository path
(``results/benchmarks.md`` is served as ``results/benchmarks/``), and with it whatever an added
Markdown page links to in turn (the findings' reports and their plots), then rewrites each link
to the site's layout. A link whose file does not exist is left as written, so the strict build
reports it (``validation.links.not_found: warn`` in mkdocs.yml).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

# An inline Markdown link or image target, with an optional title: ](target) or ](target "t").
LINK = re.compile(r"(\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
# Fenced code blocks, whose text is not links.
FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.S | re.M)

_mounted: dict[str, str] = {}  # repository path -> site path of the files added from outside


def _root(config: Any) -> Path:
    """The repository root: the folder of mkdocs.yml."""
    return Path(config.config_file_path).resolve().parent


def _docs_prefix(config: Any) -> str | None:
    """docs_dir as a repository path ("docs"), or None when it lies outside the repository."""
    docs = Path(config.docs_dir).resolve()
    root = _root(config)
    return docs.relative_to(root).as_posix() if docs.is_relative_to(root) else None


def _targets(text: str) -> list[str]:
    """The relative link targets of a Markdown text (no URL, no bare anchor), without anchors."""
    text = FENCE.sub("", text)
    out = []
    for m in LINK.finditer(text):
        target = m.group(2)
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "/")):
            continue
        out.append(target.split("#")[0])
    return out


def _repo_path(page_repo_path: str, target: str) -> str:
    """The repository path that ``target`` names, read from the page at ``page_repo_path``."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), target))


def on_files(files: Files, config: Any) -> Files:
    """Add the files outside docs_dir that the pages link to, transitively."""
    _mounted.clear()
    root, prefix = _root(config), _docs_prefix(config)
    if prefix is None:
        return files
    todo = [
        (f"{prefix}/{f.src_uri}", Path(f.abs_src_path))
        for f in files.documentation_pages()
        if f.abs_src_path is not None  # a page generated in memory has no file to read
    ]
    while todo:
        page_repo_path, abs_path = todo.pop()
        for target in _targets(abs_path.read_text(encoding="utf-8")):
            path = _repo_path(page_repo_path, target)
            if path.startswith(("../", f"{prefix}/")) or path in _mounted:
                continue
            if not (root / path).is_file():
                continue  # left as written: the build reports it
            new = File(path, str(root), config.site_dir, config.use_directory_urls)
            clash = files.get_file_from_path(new.src_uri)
            if clash is None:
                clash = next((f for f in files if f.dest_uri == new.dest_uri), None)
            if clash is not None:
                raise PluginError(f"{path}: the site already has {clash.src_uri} there")
            files.append(new)
            _mounted[path] = new.src_uri
            if new.is_documentation_page():
                todo.append((path, root / path))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Rewrite a link to a file added by :func:`on_files` (or, from an added page, to a page of
    docs_dir) into the site's layout; every other link is left to MkDocs."""
    prefix = _docs_prefix(config)
    if prefix is None:
        return markdown
    src = page.file.src_uri
    added = src in _mounted.values()
    page_repo_path = src if added else f"{prefix}/{src}"

    def site_path(repo_path: str) -> str | None:
        if repo_path in _mounted:
            return _mounted[repo_path]
        if added and repo_path.startswith(f"{prefix}/"):
            return repo_path[len(prefix) + 1 :]
        return None

    def rewrite(m: re.Match[str]) -> str:
        target = m.group(2)
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return m.group(0)
        path, hash_, anchor = target.partition("#")
        new = site_path(_repo_path(page_repo_path, path))
        if new is None:
            return m.group(0)
        rel = posixpath.relpath(new, posixpath.dirname(src) or ".")
        return f"{m.group(1)}{rel}{hash_}{anchor}{m.group(3)}"

    # Links inside fenced code blocks are text: only the stretches between fences are rewritten.
    out, last = [], 0
    for fence in FENCE.finditer(markdown):
        out.append(LINK.sub(rewrite, markdown[last : fence.start()]))
        out.append(fence.group(0))
        last = fence.end()
    out.append(LINK.sub(rewrite, markdown[last:]))
    return "".join(out)

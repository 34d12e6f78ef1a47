"""``python -m harness.peers.trl``: print the mapping table of docs/trl.md."""

from __future__ import annotations

from harness.peers.trl.mapping import markdown

if __name__ == "__main__":
    print(markdown(), end="")

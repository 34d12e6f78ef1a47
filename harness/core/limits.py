"""Size and time bounds on everything a user hands the harness, stated once.

Every reader of user files is bounded before it parses (a 200 MB YAML file took over a minute;
one 2 MB prompt padded into a batch with 320 others took 23 GB). The README states these sizes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

MIB = 1024 * 1024
MAX_YAML_BYTES = 1 * MIB  # run and experiment files (the shipped ones are a few KB)
MAX_TASK_FILE_BYTES = 64 * MIB  # jsonl task files (GSM8K's train split is ~4 MB)
MAX_TEXT_CHARS = 1 * MIB  # one prompt or answer, in characters
MAX_TEMPLATE_BYTES = 1 * MIB  # a chat template file
MAX_MODEL_CONFIG_BYTES = 4 * MIB  # a model directory's config.json
TEMPLATE_RENDER_SECONDS = 10.0  # rendering every probed prompt through the chat template
# Dataset tasks (hf:, jsonl:, python: examples): what one may materialize, checked from the
# Parquet metadata and per Arrow batch before any row becomes a Python object (an 850 KB
# dictionary-encoded Parquet file held 20 M rows, a MemoryError under 4 GB).
MAX_TASK_ROWS = 1_000_000  # rows (GSM8K's train split has 7,473; MATH's 12,500)
MAX_TASK_DATA_BYTES = 256 * MIB  # prompt + answer text after decompression and decoding
MAX_DATASET_SHARDS = 1024  # Arrow files of one save_to_disk split (a 64 MiB split needs one)
# The three task-data bounds above are defaults a run may move (task_options.max_rows,
# max_file_mib, max_data_mib), each up to a ceiling of its own: past these the harness's design
# (every example held as Python strings, in one process, split by sorting every prompt) needs
# more memory than one machine has, so a dataset that size belongs in a different pipeline.
CEILING_TASK_ROWS = 100_000_000  # ~10 GB of Python objects for short rows
CEILING_TASK_FILE_MIB = 16 * 1024
CEILING_TASK_DATA_MIB = 64 * 1024
# rg: generators run Python loops whose cost their options set (knights_knaves with 12 people
# ran for minutes on one item): each is bounded in time while the harness draws from it.
TASK_BUILD_SECONDS = 60.0  # building a generator (some draw their whole pool up front)
TASK_ITEM_SECONDS = 10.0  # drawing one item (countdown's default items take ~0.3 s)
TASK_PROBE_SECONDS = 300.0  # drawing every prompt the validation probe reads


@dataclass(frozen=True)
class DataBounds:
    """What one task's data may hold: rows, bytes of the files read, bytes of decoded prompt and
    answer text.  The defaults are the module's bounds; a run moves them with
    ``task_options.max_rows`` / ``max_file_mib`` / ``max_data_mib``, whose names the refusals
    give (``rows_option`` ...) so a user over a bound learns which option raises it."""

    rows: int = MAX_TASK_ROWS
    file_bytes: int = MAX_TASK_FILE_BYTES
    data_bytes: int = MAX_TASK_DATA_BYTES

    rows_option = "task_options.max_rows"
    file_option = "task_options.max_file_mib"
    data_option = "task_options.max_data_mib"

    @classmethod
    def from_options(cls, max_rows: int, max_file_mib: int, max_data_mib: int) -> DataBounds:
        return cls(max_rows, max_file_mib * MIB, max_data_mib * MIB)

    def rows_refusal(self, held: str) -> str:
        """``"<held>; a task's data may hold at most N rows (raise task_options.max_rows)"``."""
        return (
            f"{held}; a task's data may hold at most {self.rows:,} rows (raise "
            f"{self.rows_option} for more)"
        )

    def file_refusal(self, held: str) -> str:
        top = self.file_bytes
        return (
            f"{held}; a task's data may be at most {top:,} bytes ({_mib(top)} MiB; raise "
            f"{self.file_option} for more)"
        )

    def data_refusal(self, held: str) -> str:
        top = self.data_bytes
        return (
            f"{held}; a task's data may decode to at most {top:,} bytes ({_mib(top)} MiB) of "
            f"text (raise {self.data_option} for more)"
        )


def _mib(n: int) -> str:
    return f"{n // MIB:,}" if n % MIB == 0 else f"{n / MIB:.2f}"


DEFAULT_DATA_BOUNDS = DataBounds()


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def not_regular(path: str | Path) -> str | None:
    """What ``path`` is when it exists but is not a regular file ("a FIFO", "a directory", "a
    symlink loop"), else None.

    Why stat and never open: opening a FIFO for reading blocks until a writer comes (the command
    hung), and opening a device can act on it. ``os.stat`` follows symlinks, so a link to a FIFO
    is a FIFO."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        return "a symlink loop" if err.errno == errno.ELOOP else None
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def check_regular(path: str | Path, shown: str | Path | None = None) -> None:
    """Raise ValueError ``"NAME: is a FIFO, not a regular file"`` unless ``path`` is missing or
    a regular file (a missing file is the caller's to report)."""
    kind = not_regular(path)
    if kind is not None:
        raise ValueError(f"{path if shown is None else shown}: is {kind}, not a regular file")


def file_too_big(path: str | Path, limit: int, what: str, option: str | None = None) -> str | None:
    """The one-line reason ``path`` is refused for its size, or None when it is small enough;
    ``option`` names the setting that raises ``limit``, when one does."""
    try:
        size = Path(path).stat().st_size
    except OSError:
        return None  # the reader reports a missing or unreadable file itself
    if size <= limit:
        return None
    raise_it = f"; raise {option} for more" if option else ""
    return (
        f"{path}: is {size:,} bytes; {what} may be at most {limit:,} bytes ({_mib(limit)} "
        f"MiB{raise_it})"
    )


class NotUtf8(ValueError):
    """A bounded read found bytes that are not UTF-8 (the caller may say what it expected)."""


def open_bounded(
    path: str | Path,
    limit: int,
    what: str,
    shown: str | Path | None = None,
    option: str | None = None,
) -> BinaryIO:
    """``path`` opened to read bytes, refused before any read when it is over ``limit``.

    Raises ValueError with the one-line reason: its size (naming ``path``), or that it cannot be
    read (naming ``shown``, the path as the user wrote it, when given).  A missing file is the
    caller's to report: each says what it expected there.  Anything but a regular file (a FIFO,
    a device, a directory) is refused without being opened (:func:`check_regular`).  ``option``
    names the setting that raises ``limit`` (see :func:`file_too_big`)."""
    check_regular(path, shown)
    too_big = file_too_big(path, limit, what, option)
    if too_big:
        raise ValueError(too_big)
    try:
        return Path(path).open("rb")
    except OSError as err:
        name = path if shown is None else shown
        raise ValueError(f"{name}: cannot be read ({err.strerror})") from None


def read_bounded_text(
    path: str | Path, limit: int, what: str, shown: str | Path | None = None
) -> str:
    """The UTF-8 text of ``path``, bounded by :func:`open_bounded` (whose ValueError it raises,
    as it does for a read that fails; :class:`NotUtf8` for bytes that are not UTF-8)."""
    name = path if shown is None else shown
    with open_bounded(path, limit, what, shown) as fh:
        try:
            return fh.read().decode("utf-8")
        except UnicodeDecodeError as err:
            raise NotUtf8(f"{name}: is not valid UTF-8 (byte {err.start})") from None
        except OSError as err:
            raise ValueError(f"{name}: cannot be read ({err.strerror})") from None


class RenderTimeout(Exception):
    """A chat template took longer than its time bound to render."""


@contextlib.contextmanager
def time_bound(
    seconds: float, error: type[BaseException] = RenderTimeout, *, cpu: bool = False
) -> Iterator[None]:
    """Raise ``error`` (:class:`RenderTimeout` by default) in this block after ``seconds`` of wall
    clock (``SIGALRM`` from ``ITIMER_REAL``) or, with ``cpu``, of this process's CPU time
    (``SIGPROF`` from ``ITIMER_PROF``: every thread's time counts).

    Why a signal timer: a Jinja template is Python code (``{% for i in range(100000) %}`` nested
    is 10^10 iterations), and SIGALRM interrupts it between bytecodes; a thread could not be
    stopped. Only the main thread can take signals: elsewhere the block runs unbounded. An
    enclosing wall-clock timer (e.g. a test runner's) is restored, less the time spent here; an
    armed CPU timer is a profiler's, which samples rather than bounds: the block then runs
    unbounded and leaves it alone.  Code that catches ``Exception`` around its own loops (some
    task generators, math-verify) would swallow an ``Exception``: bound such code with a
    ``BaseException`` subclass."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "setitimer"
    ):
        yield
        return
    timer, sig = (
        (signal.ITIMER_PROF, signal.SIGPROF) if cpu else (signal.ITIMER_REAL, signal.SIGALRM)
    )
    outer, _ = signal.getitimer(timer)
    if cpu and outer > 0:
        yield
        return

    # An enclosing bound that ends first still ends this block, with its own error: the inner
    # bound must not stretch the outer one (a slow first item inside a 0.5 s probe bound).
    outer_first = 0 < outer < seconds
    armed = outer if outer_first else seconds
    fired_outer: list[bool] = []

    def expire(signum: int, frame: Any) -> None:
        if outer_first and callable(previous):
            fired_outer.append(True)
            previous(signum, frame)  # the enclosing bound's handler raises its error
        raise error

    previous = signal.signal(sig, expire)
    signal.setitimer(timer, armed)
    try:
        yield
    finally:
        left, _ = signal.setitimer(timer, 0)
        signal.signal(sig, previous)
        if outer and not fired_outer:
            signal.setitimer(timer, max(outer - (armed - left), 1e-3))

"""verl's command line: a value as a Hydra override (``key=value``), shell-quoted where the shell
would otherwise read it; strings are refused unless they are plain module names (Hydra would
interpolate ``${...}`` inside quotes)."""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

from harness.core.configtools import ConfigError

# A string verl gets unquoted: a plain module name.  Anything else is refused rather than
# quoted: Hydra still resolves ${...} inside quoted values, and words such as true/null/inf
# would change type.
VERL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_HYDRA_WORDS = {"true", "false", "null", "none", "inf", "nan"}


class Quoted(str):
    """A string the export itself composed from numbers and option names (verl's "0.5_5.0"
    thresholds, "token_k1,seq_mean_k3" lists): double-quoted for Hydra, never user text."""


_QUOTABLE = re.compile(r"[A-Za-z0-9_.,+\-]+")


def hydra_value(v: Any, where: str) -> str:
    """A Hydra override value for ``v`` (bool, number, None, plain name, or a list of them)."""
    if isinstance(v, Quoted):
        if not _QUOTABLE.fullmatch(v):  # pragma: no cover - composed from numbers and names
            raise ValueError(f"{where}: {v!r} is not a composed verl value")
        return f'"{v}"'
    if isinstance(v, bool):
        return "True" if v else "False"
    if v is None:
        return "null"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            raise ValueError("NaN has no exported value")
        if not math.isfinite(v):
            return "inf" if v > 0 else "-inf"
        text = repr(v)
        if "e" not in text and len(text) > 8:  # 1000000000.0 -> 1e9, when exact
            digits = next(d for d in range(17) if float(f"{v:.{d}e}") == v)
            mantissa, exp = f"{v:.{digits}e}".split("e")
            short = f"{mantissa}e{int(exp)}"
            text = short if len(short) < len(text) else text
        return text
    if isinstance(v, list | tuple):
        return "[" + ",".join(hydra_value(x, where) for x in v) + "]"
    text = str(v)
    if not VERL_NAME.fullmatch(text) or text.lower() in _HYDRA_WORDS:
        raise ConfigError(
            f"{where}: {text!r} cannot be written as a verl override (module names are letters, "
            "digits, '_', '.', '-', starting with a letter or '_')"
        )
    return text


def override(key: str, value: Any, where: str = "") -> str:
    """``key=value`` for verl's command line, shell-quoted when the shell would read it
    (``[...]`` is a glob pattern)."""
    return shlex.quote(f"{key}={hydra_value(value, where or key)}")

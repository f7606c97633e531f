"""Each C++ unit of csrc/ compiles alone: it includes the headers of what it uses and nothing relies on the order in
which the units are built. Syntax only (no code generation), with the include paths and flags torch's build uses."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor

import pytest
from torch.utils import cpp_extension

from accel.kernels import cpu

UNITS = sorted(p.stem for p in cpu.CSRC.glob("*.cpp"))
WORKERS = 2  # units in parallel: each parses torch's headers alone, most of its cost


def _compiler() -> str | None:
    compiler = cpp_extension.get_cxx_compiler()
    return shutil.which(compiler)


def _flags() -> list[str]:
    """What torch's `load` compiles each unit with (`_write_ninja_file_to_build_library`), but -fsyntax-only."""
    system = cpp_extension.include_paths() + [sysconfig.get_paths()["include"]]
    return (["-DTORCH_EXTENSION_NAME=accel_units_test", "-DTORCH_API_INCLUDE_EXTENSION_H", f"-I{cpu.CSRC}"]
            + [arg for path in system for arg in ("-isystem", path)]
            + ["-fPIC", "-std=c++20", *cpu.CFLAGS, "-fsyntax-only"])


def _first_error(unit: str, compiler: str, flags: list[str]) -> str | None:
    """None where `unit` compiles alone, else its first error line."""
    run = subprocess.run([compiler, *flags, str(cpu.CSRC / f"{unit}.cpp")], capture_output=True, text=True)
    if run.returncode == 0:
        return None
    lines = run.stderr.splitlines()
    return next((line for line in lines if "error" in line), lines[0] if lines else f"exit {run.returncode}")


def test_the_units_are_the_cpp_files_of_csrc():
    assert sorted(cpu.SOURCES) == UNITS


@pytest.mark.slow
def test_each_unit_compiles_alone():
    compiler = _compiler()
    if compiler is None:
        pytest.skip("no C++ compiler found")
    flags = _flags()
    with ThreadPoolExecutor(WORKERS) as pool:
        errors = dict(zip(UNITS, pool.map(lambda unit: _first_error(unit, compiler, flags), UNITS)))
    failed = [f"{unit}.cpp: {error}" for unit, error in errors.items() if error]
    assert not failed, "units that do not compile alone:\n" + "\n".join(failed)

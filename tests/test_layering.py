"""Import rules between packages, read from the source (including imports inside functions)."""

import ast
from pathlib import Path

ACCEL = Path(__file__).resolve().parents[1] / "accel"


def imports(package: str) -> dict[str, set[str]]:
    """{module file: every `accel.*` module it imports} for the files of accel/<package> (or one file)."""
    root = ACCEL / package
    files = [root.with_suffix(".py")] if root.with_suffix(".py").exists() else sorted(root.rglob("*.py"))
    out = {}
    for f in files:
        names = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        out[str(f.relative_to(ACCEL))] = {n for n in names if n.startswith("accel")}
    return out


def test_serving_code_imports_no_training_code():
    for package in ("runtime", "speculative", "server", "recipe", "preflight"):
        for f, mods in imports(package).items():
            assert not [m for m in mods if m.startswith("accel.draft_training")], f


def test_only_the_engine_wires_speculation_into_the_runtime():
    for f, mods in imports("runtime").items():
        spec = {m for m in mods if m.startswith("accel.speculative")}
        if f != "runtime/engine.py":
            assert spec <= {"accel.speculative.stats"}, f  # the torch-free counters a Sequence carries


def test_speculation_uses_the_runtime_leaves_never_the_engine_or_scheduler():
    for f, mods in imports("speculative").items():
        assert not mods & {"accel.runtime.engine", "accel.runtime.scheduler", "accel.runtime"}, f


def test_the_scheme_registry_sits_on_the_kernels_and_the_kernels_read_only_it():
    for f, mods in imports("schemes").items():
        assert {m for m in mods if not m.startswith(("accel.schemes", "accel.kernels"))} == set(), f
    for f, mods in imports("kernels").items():
        assert {m for m in mods if not m.startswith(("accel.schemes", "accel.kernels", "accel.tensorio",
                                                     "accel.memory"))} == set(), f

"""Checks over the whole repository that a single module's tests cannot make: pickles are never unpickled,
and a CPU-only install does not pull in Triton."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ["holotron", "scripts", "dev", "benchmarks", "tests"]


def _python_files():
    for top in SOURCES:
        yield from sorted((REPO / top).rglob("*.py")) if (REPO / top).is_dir() else ()


def _unsafe_torch_loads(source: str) -> list[int]:
    """Lines of ``torch.load(...)`` calls without ``weights_only=True``."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"):
            kw = {k.arg: k.value for k in node.keywords}
            ok = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
            if not ok:
                bad.append(node.lineno)
    return bad


def test_the_check_sees_an_unsafe_load():
    assert _unsafe_torch_loads("import torch\nx = torch.load('a.pt')\n"
                               "y = torch.load('b', weights_only=False)\n") == [2, 3]
    assert _unsafe_torch_loads("import torch\nx = torch.load('a.pt', map_location='cpu', weights_only=True)\n") == []


def test_every_torch_load_refuses_pickled_code():
    """torch >= 2.4 is allowed, where torch.load unpickles arbitrary objects unless told weights_only=True."""
    bad = {str(p.relative_to(REPO)): lines for p in _python_files() if (lines := _unsafe_torch_loads(p.read_text()))}
    assert not bad, f"torch.load without weights_only=True: {bad}"


def test_triton_is_not_a_base_dependency():
    """A CPU-only `pip install -e .` must not pull ~1 GB of triton it never imports; the CUDA builds of torch
    bring their own, and the test extra installs it so the interpreter tests run in CI."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    name = lambda req: req.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()  # noqa: E731
    assert "triton" not in {name(r) for r in project["dependencies"]}
    assert "triton" in {name(r) for r in project["optional-dependencies"]["test"]}
    assert "triton" in {name(r) for r in project["optional-dependencies"]["triton"]}

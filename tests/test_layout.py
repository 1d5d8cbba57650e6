"""The house rules that a reorganisation must keep: public API, CLI flags and checkpoint format unchanged,
an import graph without loops, files a reader takes in one sitting.

The snapshots (``PUBLIC_API`` below, ``tests/data/cli_flags.json``) were taken from the code before the
training wing and the kernels were split into files of one concept each; a change to either is a change
of contract and must be made on purpose, here.
"""

from __future__ import annotations

import argparse
import ast
import json
import runpy
import sys
from pathlib import Path

import pytest

import holotron

ROOT = Path(holotron.__file__).resolve().parent
DATA = Path(__file__).parent / "data"

PUBLIC_API = ["ssd_scan", "ssd_step", "__version__", "load", "save_pretrained", "HybridLM", "TextConfig",
              "VisionConfig", "HolotronConfig", "Holotron", "Processor", "generate", "generate_text"]

CLIS = ["holotron.generate", "holotron.eval", "holotron.train", "holotron.tokenizer"]

# files allowed past MAX_LINES: the training loop (one function that reads top to bottom) only
MAX_LINES = 400
LONG_ALLOWED = {"train/loop.py"}


def test_public_api_unchanged():
    assert holotron.__all__ == PUBLIC_API
    for name in PUBLIC_API:
        assert getattr(holotron, name) is not None, name
    assert callable(holotron.generate) and callable(holotron.load) and callable(holotron.save_pretrained)


class _Parsed(Exception):
    pass


def _cli_actions(module: str, monkeypatch) -> dict:
    """The argparse parser that ``python -m module`` builds, captured at its parse_args call."""
    got = {}

    def capture(self, args=None, namespace=None):
        got["parser"] = self
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    monkeypatch.setattr(sys, "argv", [module])
    with pytest.raises(_Parsed):
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    p = got["parser"]
    actions = []
    for a in p._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        actions.append(dict(
            flags=list(a.option_strings) or [a.dest], dest=a.dest, default=repr(a.default), nargs=repr(a.nargs),
            choices=sorted(map(str, a.choices)) if a.choices else None,
            type=getattr(a.type, "__name__", repr(a.type)) if a.type else None,
            action=type(a).__name__, required=a.required))
    return dict(prog=p.prog, actions=actions)


@pytest.mark.parametrize("module", CLIS)
def test_cli_flags_unchanged(module, monkeypatch):
    want = json.loads((DATA / "cli_flags.json").read_text())[module]
    got = _cli_actions(module, monkeypatch)
    assert got["prog"] == want["prog"]
    by_flag = lambda acts: {tuple(a["flags"]): a for a in acts}  # noqa: E731
    assert sorted(by_flag(got["actions"])) == sorted(by_flag(want["actions"]))
    for flags, a in by_flag(want["actions"]).items():
        assert by_flag(got["actions"])[flags] == a, flags


def test_checkpoint_format_unchanged(tmp_path):
    """The bundled checkpoint was written by the code before the split: it loads strictly, and writing it
    again gives the same safetensors bytes, the same index and the same config."""
    from holotron import bundled

    src = Path(bundled.default_model())
    model = holotron.load(src)
    holotron.save_pretrained(model, tmp_path, max_shard_size=8_000_000)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in written if n.endswith(".safetensors")] == [f"model-0000{i}-of-00004.safetensors" for i in
                                                                   range(1, 5)]
    for name in written:
        if name.endswith((".safetensors", ".index.json")) or name == "generation_config.json":
            assert (tmp_path / name).read_bytes() == (src / name).read_bytes(), name
        elif name.endswith(".json"):
            assert json.loads((tmp_path / name).read_text()) == json.loads((src / name).read_text()), name


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _imports(mod: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The package modules ``mod`` imports (``from . import x`` counts as importing ``pkg.x``, not ``pkg``)."""
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
            if len(subs) == len(node.names):  # `from pkg import submodule, ...`: the submodules only
                out.update(subs)
            elif target in mods:
                out.add(target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in mods)
    out.discard(mod)
    return out


def test_import_graph_has_no_loops():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    loops, done, stack = [], set(), []

    def visit(m):
        if m in stack:
            loops.append(stack[stack.index(m):] + [m])
            return
        if m in done:
            return
        stack.append(m)
        for n in sorted(graph[m]):
            visit(n)
        stack.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)
    assert not loops, "import loops: " + "; ".join(" -> ".join(loop) for loop in loops)


def test_no_module_imports_a_package_above_it():
    """A module never imports its own package's ``__init__`` (or an ancestor's): those re-export from the
    modules below them, so importing them from below is a loop waiting to happen."""
    mods = _modules()
    bad = []
    for m, p in mods.items():
        for target in _imports(m, p, mods):
            if mods[target].name == "__init__.py" and m.startswith(target + "."):
                bad.append(f"{m} imports {target}")
    assert not bad, bad


def test_files_hold_one_sitting():
    long = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        n = len(path.read_text().splitlines())
        if n > MAX_LINES and rel not in LONG_ALLOWED:
            long[rel] = n
    assert not long, f"files over {MAX_LINES} lines: {long}"


def _readme_layout() -> str:
    readme = (ROOT.parent / "README.md").read_text()
    start = readme.index("## Layout")
    return readme[readme.index("```", start) + 3: readme.index("```", readme.index("```", start) + 3)]


def test_readme_layout_matches_the_tree():
    """Every file and folder of the package (and of kernels/, vision/, train/) is named in the README's
    layout block, and every name there exists."""
    block = _readme_layout()
    words = set(block.replace(",", " ").replace("(", " ").replace(")", " ").replace(":", " ").split())
    missing = []
    for folder in (ROOT, ROOT / "kernels", ROOT / "vision", ROOT / "train"):
        for entry in sorted(folder.iterdir()):
            if entry.name == "__pycache__" or entry.suffix not in ("", ".py"):
                continue
            name = entry.name + ("/" if entry.is_dir() else "")
            if name not in words:
                missing.append(str(entry.relative_to(ROOT)))
    assert not missing, f"not in the README's layout: {missing}"
    named = {w for w in words if w.endswith((".py", "/")) and not w.startswith(("`", "$"))}
    top = {"tests/", "benchmarks/", "notebooks/", "docs/", "scripts/", "dev/", "holotron/", "runs/", "probes/"}
    where = [ROOT, ROOT / "kernels", ROOT / "vision", ROOT / "train"]
    absent = [w for w in named - top if not any((d / w.rstrip("/")).exists() for d in where)]
    assert not absent, f"named in the README's layout but not in the tree: {absent}"

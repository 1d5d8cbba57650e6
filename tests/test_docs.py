"""The docs cannot drift from the code: the Python examples in docs/usage.md run against a tiny checkpoint
and print what the doc quotes (the `# ...` comment under each print); every link and repository path named
in docs/*.md, README.md, CONTRIBUTING.md and dev/LOG.md exists. (The example in docs/architecture.md is run
by tests/test_generate.py.)"""

import contextlib
import io
import re
import subprocess
from pathlib import Path

import pytest
from PIL import Image
from tiny_lm import scan_backend_of_the_device  # noqa: F401  (autouse: chunked scan, one thread)
from tiny_vl import write_tiny_vl_checkpoint

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _quoted_outputs(code: str) -> list[str]:
    """The comment line right after each top-level print(...) statement, without its '<- note'."""
    lines = code.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.startswith("print(") and i + 1 < len(lines) and lines[i + 1].startswith("# "):
            out.append(lines[i + 1][2:].split("  <-")[0].rstrip())
    return out


def test_usage_examples_run_and_print_what_the_doc_says(tmp_path):
    ckpt = write_tiny_vl_checkpoint(tmp_path / "tiny-vl", seed=0)
    shot = tmp_path / "shot.png"
    im = Image.new("RGB", (320, 200), (240, 240, 240))
    im.paste((30, 90, 200), (20, 20, 120, 60))
    im.save(shot)
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / "usage.md").read_text(), re.S)
    assert len(blocks) >= 3
    env = {"CKPT": str(ckpt), "SHOT": str(shot)}
    for i, code in enumerate(blocks):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(compile(code, f"docs/usage.md block {i}", "exec"), env)
        printed = [line.rstrip() for line in buf.getvalue().splitlines()]
        assert printed == _quoted_outputs(code), f"docs/usage.md block {i}"


ROOT = DOCS.parent
# the documents whose references are checked: the user docs, the top-level guides and the lab notebook
CHECKED = ["docs/*.md", "README.md", "CONTRIBUTING.md", "dev/LOG.md"]
# a repository path written in the text (prose, backticks or code blocks): a top-level folder, then a path
_REPO_PATH = re.compile(r"(?<![\w./$~-])((?:holotron|docs|dev|scripts|tests|benchmarks|notebooks)/[\w./{},*-]*)")
# a path in a commit of the history, not in the tree: git's COMMIT:PATH, or `git archive COMMIT PATH`
_HISTORY_PATH = re.compile(r"(?:\b([0-9a-f]{7,40}):|git archive ([0-9a-f]{7,40}) )"
                           r"((?:holotron|docs|dev|scripts|tests|benchmarks|notebooks)/[\w./-]*)")
# a markdown link or image: [text](target) / ![alt](target "title")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _checked_docs() -> list[Path]:
    return sorted({p for pattern in CHECKED for p in ROOT.glob(pattern)})


def _broken_references(doc: Path) -> list[str]:
    text = doc.read_text(encoding="utf-8")
    broken = []
    for m in _LINK.finditer(text):
        target = m.group(1).split("#")[0]
        if not target or re.match(r"[a-z][a-z0-9+.-]*:", target):  # an anchor, or http:, mailto:, ...
            continue
        if not (doc.parent / target).exists():
            broken.append(f"link ({target})")
    in_history = set()
    for m in _HISTORY_PATH.finditer(text):
        in_history.add(m.start(3))
        commit, path = m.group(1) or m.group(2), m.group(3).rstrip(".,:;")
        if _in_commit(commit, path) is False:
            broken.append(f"{commit}:{path}")
    for m in _REPO_PATH.finditer(text):
        if m.start(1) in in_history:
            continue
        path = m.group(1).rstrip(".,:;")
        if any(c in path for c in "{},*"):  # a pattern (tiny-model-{read,ground}.csv, *.py), not one file
            continue
        if not (ROOT / path).exists():
            broken.append(path)
    return broken


def _in_commit(commit: str, path: str) -> bool | None:
    """Whether ``path`` exists in ``commit`` of this repository; None when that cannot be told here (no git, not
    a clone, or a shallow clone without that commit)."""
    def git(*args):
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)

    try:
        if git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
            return None
    except OSError:
        return None
    return git("cat-file", "-e", f"{commit}:{path.rstrip('/')}").returncode == 0


def test_the_checked_documents_exist():
    names = {str(p.relative_to(ROOT)) for p in _checked_docs()}
    assert {"README.md", "CONTRIBUTING.md", "dev/LOG.md", "docs/usage.md", "docs/architecture.md"} <= names


def test_every_link_and_repository_path_in_the_docs_exists():
    """A markdown link (relative to the document) or a repository path named in the text (relative to the
    repository root: holotron/..., docs/..., dev/..., scripts/..., tests/..., benchmarks/..., notebooks/...)
    that does not exist fails, so a moved or deleted file cannot leave a dangling reference behind."""
    broken = {str(doc.relative_to(ROOT)): refs for doc in _checked_docs() if (refs := _broken_references(doc))}
    assert not broken, f"references to files that do not exist: {broken}"


def test_the_reference_check_catches_a_missing_file(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("See `holotron/no_such_module.py`, [the log](missing.md), ![a curve](runs/none.png),\n"
                   "and [fine](x.md), [web](https://example.com), [anchor](#top), `holotron/__init__.py`,\n"
                   "`dev/runs/tiny-model-{read,ground}-log.csv` (a pattern), /tmp/holotron/elsewhere.\n")
    assert _broken_references(doc) == ["link (missing.md)", "link (runs/none.png)", "holotron/no_such_module.py"]


def test_a_path_named_in_a_commit_is_checked_in_that_commit(tmp_path):
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git clone: references into the history cannot be checked")
    c = head.stdout.strip()
    doc = tmp_path / "x.md"
    doc.write_text(f"`{c}:holotron/__init__.py`, `git archive {c} holotron/no_such_folder`, `{c}:dev/no_such.pt`,\n"
                   "and `0000000:holotron/gone.py` (a commit this clone does not have: not told, not broken).\n")
    assert _broken_references(doc) == [f"{c}:holotron/no_such_folder", f"{c}:dev/no_such.pt"]


def test_readme_python_snippet_runs_as_written():
    """The README's Python example runs unchanged on this machine (it picks the device that exists) and
    prints a parsed click."""
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, "README.md python block", "exec"), {})
    assert re.fullmatch(r"Point\(x=[-0-9.]+, y=[-0-9.]+, space='model'\)", buf.getvalue().strip()), buf.getvalue()

"""The Python examples in docs/usage.md run against a tiny checkpoint, and what they print is what the
doc quotes (the `# ...` comment under each print), so they cannot drift."""

import contextlib
import io
import re
from pathlib import Path

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

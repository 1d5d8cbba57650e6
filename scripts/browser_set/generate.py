"""Render the browser grounding set: seeded HTML pages (pages.py) shot by headless Chromium, boxes from the DOM.

    python scripts/browser_set/generate.py                       # 120 screens, seed 0, into scripts/browser_set/set/
    python scripts/browser_set/generate.py --seed 1 --n 20 --out /tmp/bs --keep-verify

For each screen: the HTML is written to ``<out>/screens/NNNN-<kind>.html``, then Chromium runs three times with
the same ``--window-size``: ``--screenshot`` (the PNG), ``--dump-dom`` (the page's script has written every
target's getBoundingClientRect() into ``<pre id="boxes">``) and ``--screenshot`` of ``#verify``, where each
target is painted a flat colour of its own. A target is kept only when it is visible, unclipped, inside the
screenshot, at least ``--min-size`` px each way, and its colour in the verify shot covers the same box to
within ``--tolerance`` px (so a box that moved, or an element covered by another, is dropped). Then 2-4 kept
targets of each screen become questions (distinct roles first). The set is ``<out>/browser_set.json``: a
ScreenSpot-style list of {image (relative to the JSON), instruction, bbox (xyxy, pixels), role, kind, theme,
font, font_size, accent, viewport, screen, id}; ``<out>/info.json`` says how it was made.
"""

from __future__ import annotations

import argparse
import html
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pages  # noqa: E402  (this folder's module)

HERE = Path(__file__).resolve().parent
BOXES = re.compile(r'<pre id="boxes"[^>]*>(.*?)</pre>', re.S)


@dataclass
class Screen:
    index: int
    kind: str
    theme: str
    font: str
    font_size: int
    accent: str
    radius: int
    w: int
    h: int
    k: int  # questions to ask
    dropped: dict = field(default_factory=dict)  # reason -> count
    questions: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.index:04d}-{self.kind}"


def plan(seed: int, n: int) -> list[tuple[Screen, random.Random]]:
    """The look of each screen: kinds, themes, fonts and viewports cycle with coprime periods (7, 2, 10, 6)
    through seeded permutations, so every pair shows up; the rest is drawn per screen."""
    top = random.Random(f"browser-set/{seed}")
    fonts = list(pages.FONTS)
    views = list(pages.VIEWPORTS)
    top.shuffle(fonts)
    top.shuffle(views)
    out = []
    for i in range(n):
        rng = random.Random(f"browser-set/{seed}/{i}")
        w, h = views[i % len(views)]
        s = Screen(i, pages.KINDS[i % len(pages.KINDS)], pages.THEMES[(i + seed) % 2], fonts[i % len(fonts)],
                   rng.choice([13, 14, 15, 16]), rng.choice(sorted(pages.ACCENTS)), rng.choice([0, 4, 6, 8, 12]),
                   w, h, rng.randint(2, 4))
        out.append((s, rng))
    return out


# ----------------------------------------------------------------------------------------------
# Chromium
# ----------------------------------------------------------------------------------------------

def find_chromium(given: str | None) -> str:
    for exe in ([given] if given else ["chromium", "chromium-browser", "google-chrome", "chrome"]):
        path = shutil.which(exe) if exe else None
        if path:
            return path
    sys.exit("generate.py: no Chromium found (apt-get install -y chromium, or pass --chromium PATH)")


def chromium_version(exe: str) -> str:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def chromium(exe: str, w: int, h: int, url: str, *action: str, timeout: int = 90) -> str:
    """One headless Chromium run on ``url`` at a ``w`` x ``h`` window; returns its stdout."""
    with tempfile.TemporaryDirectory(prefix="bs-profile-") as profile:
        cmd = [exe, "--headless", "--disable-gpu", "--hide-scrollbars", "--force-device-scale-factor=1",
               "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
               f"--user-data-dir={profile}", f"--window-size={w},{h}", *action, url]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"chromium exited {res.returncode} on {url}: {res.stderr[-2000:]}")
    return res.stdout


def render(exe: str, s: Screen, html_path: Path, tmp: Path) -> tuple[Image.Image, dict, Image.Image]:
    url = html_path.resolve().as_uri()
    shot, check = tmp / f"{s.name}.png", tmp / f"{s.name}-verify.png"
    chromium(exe, s.w, s.h, url, f"--screenshot={shot}")
    dom = chromium(exe, s.w, s.h, url, "--dump-dom")
    chromium(exe, s.w, s.h, url + "#verify", f"--screenshot={check}")
    m = BOXES.search(dom)
    if not m or not m.group(1).strip():
        raise RuntimeError(f"{html_path}: no boxes in the dumped DOM")
    info = json.loads(html.unescape(m.group(1)))
    with Image.open(shot) as im:
        image = im.convert("RGB")
    with Image.open(check) as im:
        verify = im.convert("RGB")
    return image, info, verify


# ----------------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------------

def check_target(t: dict, w: int, h: int, verify: np.ndarray, min_size: float, tol: float) -> str | None:
    """Why target ``t`` (from the page's script) cannot be asked about, or None."""
    x0, y0, x1, y1 = t["box"]
    if t["nested"]:
        return "nested in another target"
    if not t["visible"]:
        return "hidden"
    if not t["inside"]:
        return "clipped"
    if x0 < 0 or y0 < 0 or x1 > w or y1 > h:
        return "outside the screenshot"
    if x1 - x0 < min_size or y1 - y0 < min_size:
        return "too small"
    color = np.array(pages.verify_color(t["index"]), dtype=np.uint8)
    ys, xs = np.nonzero(np.all(verify == color, axis=-1))
    if len(xs) == 0:
        return "not drawn (covered)"
    drawn = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
    if max(abs(a - b) for a, b in zip(drawn, (x0, y0, x1, y1))) > tol:
        return "drawn elsewhere (moved or partly covered)"
    if len(xs) < 0.5 * (x1 - x0) * (y1 - y0):
        return "mostly covered"
    return None


def choose(rng: random.Random, ok: list[dict], k: int) -> list[dict]:
    """Up to ``k`` targets, distinct roles first."""
    pool = ok[:]
    rng.shuffle(pool)
    out, roles = [], set()
    for t in pool:
        if len(out) < k and t["role"] not in roles:
            out.append(t)
            roles.add(t["role"])
    for t in pool:
        if len(out) < k and t not in out:
            out.append(t)
    return sorted(out, key=lambda t: t["index"])


def make_screen(exe: str, s: Screen, rng: random.Random, screens: Path, tmp: Path, args) -> Screen:
    ctx = pages.Ctx(rng, s.w, s.h, s.theme, s.font, s.font_size, s.radius, s.accent)
    doc = pages.document(ctx, s.kind)
    html_path = screens / f"{s.name}.html"
    html_path.write_text(doc, encoding="utf-8")
    image, info, verify = render(exe, s, html_path, tmp)
    if image.size != (s.w, s.h) or verify.size != (s.w, s.h):
        raise RuntimeError(f"{s.name}: screenshot is {image.size}, expected {(s.w, s.h)}")
    if info["screen"][:2] != [0, 0] or info["dpr"] != 1 or info["inner_width"] != s.w:
        raise RuntimeError(f"{s.name}: page geometry {info['screen']} dpr {info['dpr']} "
                           f"inner width {info['inner_width']}")
    if not info["font_ok"]:
        raise RuntimeError(f"{s.name}: font {s.font!r} is not installed (fc-list)")
    names = [t["instruction"] for t in info["targets"]]
    if len(set(names)) != len(names):
        raise RuntimeError(f"{s.name}: an instruction is used twice: {sorted(n for n in names if names.count(n) > 1)}")
    varr = np.asarray(verify)
    ok = []
    for t in info["targets"]:
        why = check_target(t, s.w, s.h, varr, args.min_size, args.tolerance)
        if why:
            s.dropped[why] = s.dropped.get(why, 0) + 1
            if args.verbose:
                print(f"{s.name}: dropped {t['instruction']!r} ({t['role']}, box "
                      f"{[round(v, 1) for v in t['box']]}): {why}", file=sys.stderr)
        else:
            ok.append(t)
    s.questions = choose(rng, ok, s.k)
    image.save(screens / f"{s.name}.png", optimize=True)
    if args.keep_verify:
        verify.save(screens / f"{s.name}-verify.png", optimize=True)
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=120, help="screens (default 120)")
    ap.add_argument("--out", default=str(HERE / "set"), help="output folder (default scripts/browser_set/set)")
    ap.add_argument("--chromium", help="the Chromium binary (default: chromium on PATH)")
    ap.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--min-size", type=float, default=6.0, help="smallest box side kept, px (default 6)")
    ap.add_argument("--tolerance", type=float, default=2.0,
                    help="largest gap between the DOM box and the verify colour, px (default 2)")
    ap.add_argument("--keep-verify", action="store_true", help="also keep the verify screenshots")
    ap.add_argument("--verbose", action="store_true", help="say which targets were dropped and why")
    args = ap.parse_args(argv)
    exe = find_chromium(args.chromium)
    version = chromium_version(exe)
    out = Path(args.out)
    screens = out / "screens"
    screens.mkdir(parents=True, exist_ok=True)
    for old in screens.iterdir():  # a smaller --n must not leave earlier screens behind
        if old.suffix in (".png", ".html") and old.is_file():
            old.unlink()
    t0 = time.time()
    plans = plan(args.seed, args.n)
    with tempfile.TemporaryDirectory(prefix="browser-set-") as tmp, ThreadPoolExecutor(args.jobs) as pool:
        done = list(pool.map(lambda p: make_screen(exe, p[0], p[1], screens, Path(tmp), args), plans))
    items, dropped = [], {}
    for s in done:
        for why, c in s.dropped.items():
            dropped[why] = dropped.get(why, 0) + c
        for j, t in enumerate(s.questions):
            items.append({"id": f"{s.name}-{j}", "image": f"screens/{s.name}.png", "instruction": t["instruction"],
                          "bbox": [round(v, 2) for v in t["box"]], "role": t["role"], "kind": s.kind,
                          "theme": s.theme, "font": s.font, "font_size": s.font_size, "accent": s.accent,
                          "viewport": f"{s.w}x{s.h}", "screen": s.index})
    (out / "browser_set.json").write_text(json.dumps(items, indent=1) + "\n", encoding="utf-8")
    few = [s.name for s in done if len(s.questions) < 2]
    info = {"seed": args.seed, "n_screens": len(done), "n_questions": len(items), "chromium": version,
            "window_sizes": sorted({f"{s.w}x{s.h}" for s in done}), "min_size": args.min_size,
            "tolerance": args.tolerance, "targets_dropped": dict(sorted(dropped.items())),
            "screens_with_fewer_than_2_questions": few,
            "command": "python scripts/browser_set/generate.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    (out / "info.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    buf = io.StringIO()
    print(f"{len(done)} screens, {len(items)} questions in {time.time() - t0:.0f} s with {version}; "
          f"{size / 1e6:.1f} MB in {out}", file=buf)
    print(f"targets dropped: {info['targets_dropped']}; screens with < 2 questions: {few}", file=buf)
    print(buf.getvalue(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

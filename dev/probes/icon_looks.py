"""Which held-out look costs the icons (or another role): targets of one role on training-look screens with
one setting at a time taken from the held-out split's families (holotron/data/styles.py), against the training
looks and the whole held-out look, scored with the click pointer.

    python dev/probes/icon_looks.py [--model holotron-tiny-ui] [--n 60] [--seed0 5000000000] [--role icon]
        [--out F.json]

Seeds from 5 x 10^9: neither the reported (10^9) nor the dev (3 x 10^9) range, nor a training stream. Every
condition uses the same seeds, so the conditions differ only by the setting they change (and what that
setting moves on the screen), except where a seed gives no screen with a target of the role (tabs on some
held-out sizes): the next seed is taken. Float32 on the CPU by default."""
import argparse
import json
import sys
import time

import holotron
from holotron import Processor
from holotron.data import generate_sample
from holotron.data.eval_sets import Example
from holotron.eval import evaluate

# condition -> generate_sample options; "train" is the training split's looks, "heldout" the held-out split's
CONDITIONS = {
    "train": dict(split="train"),
    "theme sepia": dict(split="train", theme="sepia"),
    "theme midnight": dict(split="train", theme="midnight"),
    "held-out hues": dict(split="train", accent_hue=None, hue="heldout"),
    "corners pill": dict(split="train", corner="pill"),
    "font 20 px": dict(split="train", font_size=20),
    "font 15/17 px": dict(split="train", font_size=(15, 17)),
    "held-out sizes": dict(split="train", size=("tablet-portrait", "phone-landscape", "ultrawide")),
    "held-out layouts": dict(split="train", layout=("panels", "wizard")),
    "heldout": dict(split="heldout"),
}
HELDOUT_BANDS = (2, 5, 8, 11)


def examples(name: str, opts: dict, n: int, seed0: int, role: str = "icon"):
    opts = dict(opts)
    hue = opts.pop("hue", None)
    made, seed = 0, seed0
    while made < n and seed < seed0 + 5 * n:
        if hue == "heldout":  # a hue from the held-out bands, drawn from the seed alone
            opts["accent_hue"] = 30 * HELDOUT_BANDS[seed % 4] + 1 + (seed // 4) % 28
        try:
            s = generate_sample(seed, roles=(role,), **opts)
        except RuntimeError:  # a role such a screen rarely draws (tabs on a phone-landscape screen): the next seed
            seed += 1
            continue
        yield Example(s.image, s.instruction, s.target_box, s.target.role, f"{name}-{seed}",
                      family=s.settings["size_family"])
        seed, made = seed + 1, made + 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="holotron-tiny-ui")
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--seed0", type=int, default=5_000_000_000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--role", default="icon", help="the targets' role (holotron.data.ROLES)")
    ap.add_argument("--only", nargs="*", help="the conditions to run (default all)")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    model = holotron.load(a.model, device=a.device)
    proc = Processor.from_pretrained(a.model)
    rows = {}
    for name, opts in CONDITIONS.items():
        if a.only and name not in a.only:
            continue
        t0 = time.perf_counter()
        rep = evaluate(model, proc, examples(name, opts, a.n, a.seed0, a.role), batch_size=8, device=a.device,
                       total=a.n, progress=False)
        rows[name] = {"hits": rep.hits, "n": rep.n, "accuracy": rep.accuracy, "seconds": time.perf_counter() - t0}
        print(f"{name:18s} {rep.hits:3d} / {rep.n}  {100 * rep.accuracy:5.1f}%", file=sys.stderr, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": a.model, "role": a.role, "n": a.n, "seed0": a.seed0, "device": a.device,
                       "conditions": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

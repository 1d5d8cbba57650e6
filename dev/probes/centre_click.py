"""Probe: can the element-centre head the ground stage trains (``AuxHeads.centre_mid``: from the residual stream
entering the last attention layer, each image token's (f cx, f cy, f), the centre of the element whose box or
label text holds the token) turn the click pointer's choice of token into a precise click? The shipped pointer
(``holotron/click_pointer.py``) lets the model write its value only inside the most-attended token's cell: a
32 px cell caps the precision, and when the most-attended token is a control's label (a text field's, a
checkbox's, a switch's: the pointer was trained on both) the click lands on the label. The centre head was
trained to say, at a label's tokens, where its control is.

On dev screens (the held-out split's ``DEV_SEED0`` range: for decisions), one question each, the inference
prompt; at the position that writes x, the pointer heads' attention over the image tokens (probabilities
averaged over the heads) picks the top token t. Clicks, each scored by the scorer's rule:

    in cell       the shipped pointer: the model's best x value inside t's cell, then (after that x) its best y
                  value inside the cell of the top token at the y position
    centre        the centre head at t: (f cx / f, f cy / f)
    centre read   the attention's own read of the head over every image token: sum(a f cx) / sum(a f), same for y
    centre gated  ``centre`` where the head's f at t is at least 0.5 (t lies on an element or its label), else
                  ``in cell``
    cell of centre the model's best values inside the cell centred on ``centre`` (x, then y after that x)

    python dev/probes/centre_click.py CKPT [--n 200] [--offset 0] [--heads 2] [--json OUT.json]
    python dev/probes/centre_click.py CKPT --centre-error 6     # the head's error itself, per split

``--centre-error N``: on N dev-seed screens of each split, the head's centre (f cx / f, f cy / f) at every image
token whose target has f = 1 (matching.match_targets) against that target: median and 90th percentile of the
absolute error in 0-1000 units per axis, and how often f > 0.5 where the target's f is 1 or 0.

CKPT: a holotron.train output folder with ``aux_heads.pt``. CPU, fp32. Also per target role.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch

from holotron.data import generate_sample
from holotron.data.eval_report import wilson_interval
from holotron.eval import DEV_SEED0
from holotron.train.batches import ScreenBatches
from holotron.train.pointer import attention_scores
from holotron.train.tiles import normalize_tiles

sys.path.insert(0, str(Path(__file__).parent))
from pointer_click import _cell, _in_cell, load  # noqa: E402  (the token grid, a cell's best value, loading)

METHODS = ("in cell", "centre", "centre read", "centre gated", "cell of centre")


def run(folder, n: int = 200, offset: int = 0, heads: int = 2, split: str = "heldout") -> dict:
    folder = Path(folder)
    model, aux, coords, seen, hook = load(folder, "centre_click")
    block = model.language_model.backbone.layers[aux.layer + 1]
    coord_t = torch.tensor(coords)
    emb = model.language_model.backbone.embeddings
    hits = {m: collections.Counter() for m in METHODS}    # role -> hits, and "all"
    axis = {m: [0, 0] for m in METHODS}
    roles, f_top, done = collections.Counter(), [], 0
    try:
        with torch.no_grad():
            for i in range(offset, offset + n):
                seed = DEV_SEED0 + i
                role = generate_sample(seed, split=split).target.role
                batch = ScreenBatches(folder, model.config.vision, 1, queries=1, split=split, seeds=[seed])[0]
                ids = batch["input_ids"]
                is_img = (ids == model.config.image_token_id)[0]
                pixels = normalize_tiles(batch["pixel_values"], model.config.vision, None, batch["num_tiles"])
                e0 = model.embed_inputs(ids, pixels)[0]
                img = is_img.nonzero().squeeze(1)
                xy = batch["image_positions"]                                    # (n_img, 2) token centres, 0-1
                cell = [_cell(xy[:, a]) for a in (0, 1)]
                (_, px, xlo, xhi, _), (_, py, ylo, yhi, _) = batch["coord_targets"][:2].tolist()

                def at(e, t):  # coordinate logits, attention over the image tokens, and their centres at t
                    h = model.language_model.hidden_states(inputs_embeds=e[None, : t + 1])
                    logits = model.language_model.lm_head(h[0, t])[coord_t]
                    sc = attention_scores(block, seen["h"][:, : t + 1], torch.tensor([[t]]), heads)[0, :, 0]
                    return logits, torch.softmax(sc, -1)[:, img].mean(0), aux.centre_mid(seen["h"][0, img])

                def y_after(x, centre_y=None):  # the y position's logits and top token with x written
                    e = e0.clone()
                    e[px] = emb.weight[coords[x]]
                    ly, ay, _ = at(e, py - 1)
                    c = 1000 * float(xy[int(ay.argmax())][1]) if centre_y is None else centre_y
                    return _in_cell(ly, c, 1000 * cell[1])

                lx, ax, cen = at(e0, px - 1)
                t = int(ax.argmax())
                f = float(cen[t, 2])
                f_top.append(f)
                c_top = (1000 * float(cen[t, 0]) / max(f, 1e-3), 1000 * float(cen[t, 1]) / max(f, 1e-3))
                den = float((ax * cen[:, 2]).sum())
                c_read = tuple(1000 * float((ax * cen[:, a]).sum()) / max(den, 1e-3) for a in (0, 1))
                x_cell = _in_cell(lx, 1000 * float(xy[t][0]), 1000 * cell[0])
                pick_cell = (x_cell, y_after(x_cell))
                x_cc = _in_cell(lx, _clip(c_top[0]), 1000 * cell[0])
                picks = {"in cell": pick_cell, "centre": tuple(map(_clip, c_top)),
                         "centre read": tuple(map(_clip, c_read)),
                         "centre gated": tuple(map(_clip, c_top)) if f >= 0.5 else pick_cell,
                         "cell of centre": (x_cc, y_after(x_cc, _clip(c_top[1])))}
                for m, (x, y) in picks.items():
                    okx, oky = xlo <= x <= xhi, ylo <= y <= yhi
                    axis[m][0] += okx
                    axis[m][1] += oky
                    hits[m]["all"] += okx and oky
                    hits[m][role] += okx and oky
                roles[role] += 1
                done += 1
                if done % 20 == 0:
                    print(f"{done} screens: " + ", ".join(f"{m} {hits[m]['all'] / done:.3f}" for m in METHODS),
                          file=sys.stderr)
    finally:
        hook.remove()
    return {"model": str(folder), "split": split, "seeds": f"DEV_SEED0 + {offset}..{offset + done - 1}",
            "screens": done, "heads": heads, "f_at_top_median": sorted(f_top)[len(f_top) // 2] if f_top else None,
            "roles": dict(roles),
            **{m: {"accuracy": hits[m]["all"] / done, "ci95": list(wilson_interval(hits[m]["all"], done)),
                   "x_in_box": axis[m][0] / done, "y_in_box": axis[m][1] / done,
                   "per_role": {r: hits[m][r] for r in roles}} for m in METHODS}}


def centre_error(folder, n: int = 6) -> dict:
    """The element-centre head against its targets on ``n`` dev screens of each split (see the docstring)."""
    model, aux, _, seen, hook = load(folder, "centre_click")
    out = {}
    try:
        for split in ("train", "heldout"):
            errs, agree = [], []
            for i in range(n):
                b = ScreenBatches(folder, model.config.vision, 1, queries=1, split=split, seeds=[DEV_SEED0 + i],
                                  match=True)[0]
                ids = b["input_ids"]
                img = (ids == model.config.image_token_id)[0].nonzero().squeeze(1)
                px = normalize_tiles(b["pixel_values"], model.config.vision, None, b["num_tiles"])
                with torch.no_grad():
                    model.language_model.hidden_states(inputs_embeds=model.embed_inputs(ids, px))
                    c = aux.centre_mid(seen["h"][0, img])
                t = b["image_centres"]
                on = t[:, 2] > 0.5
                errs.append(1000 * (c[on, :2] / c[on, 2:3].clamp_min(1e-3) - t[on, :2]).abs())
                agree.append(((c[:, 2] > 0.5) == on).float().mean())
            e = torch.cat(errs)
            out[split] = {"tokens": len(e), "median_abs_err_xy": e.median(0).values.tolist(),
                          "p90_abs_err_xy": e.quantile(0.9, 0).tolist(),
                          "f_agreement": float(torch.stack(agree).mean())}
    finally:
        hook.remove()
    return out


def _clip(v: float) -> int:
    return min(1000, max(0, round(v)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--centre-error", type=int, default=0, metavar="N")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.centre_error:
        r = centre_error(a.model, a.centre_error)
        for split, v in r.items():
            print(f"{split}: {v['tokens']} tokens on elements, median |error| x / y {v['median_abs_err_xy'][0]:.1f} / "
                  f"{v['median_abs_err_xy'][1]:.1f}, p90 {v['p90_abs_err_xy'][0]:.1f} / {v['p90_abs_err_xy'][1]:.1f}, "
                  f"f agrees on {100 * v['f_agreement']:.1f}% of tokens")
        if a.json:
            Path(a.json).write_text(json.dumps(r, indent=1))
        return 0
    r = run(a.model, a.n, a.offset, a.heads)
    roles = sorted(r["roles"])
    print(f"{'':15s} {'all':>6s} " + " ".join(f"{x[:8]:>8s}" for x in roles))
    print(f"{'n':15s} {r['screens']:6d} " + " ".join(f"{r['roles'][x]:8d}" for x in roles))
    for m in METHODS:
        s = r[m]
        print(f"{m:15s} {100 * s['accuracy']:5.1f}% " + " ".join(f"{s['per_role'][x]:8d}" for x in roles)
              + f"   (CI {100 * s['ci95'][0]:.1f}-{100 * s['ci95'][1]:.1f}; x {100 * s['x_in_box']:.1f}%, "
              f"y {100 * s['y_in_box']:.1f}%)")
    print(f"f at the top token, median {r['f_at_top_median']:.3f}")
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

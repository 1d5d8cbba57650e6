"""Probe: can the click pointer and the model's own coordinate distribution vote together? ``pointer_click.py``
showed the pointer's hard choice (the most-attended image token's cell, the model's best value inside it) lifts
buttons, links and icons but loses text fields and dropdowns, where the greedy digits did better (the pointer
heads look at a control's label). Here each coordinate value v is scored by

    log p(v) + lam * log A(v)

p: the model's softmax over the 1,001 coordinate values at that position; A(v): the pointer heads' attention
(averaged over heads, over the image tokens) summed over the tokens whose cell on that axis contains v (a
column's mass for x, a row's for y). lam -> infinity picks the heaviest column, then the model's best value in
it; lam = 0 is the greedy digits. Methods, each on the same dev screens (the held-out split's ``DEV_SEED0``
range), teacher-forcing the method's own x before its y:

    greedy          argmax p
    in cell         the shipped constraint (``holotron/click_pointer.py``): the most-attended token's cell
    joint L         the score above with lam = L, on both axes
    joint L col     the same, the y position's attention restricted to the tokens of the column holding x
    heavy col       the column (then row) with the most attention mass, the model's best value inside
    rerank K        among the K most-attended tokens, the one maximising A(t) * p(cell of t) on x; y in cell

    python dev/probes/pointer_joint.py CKPT [--n 200] [--heads 2] [--first 0] [--json OUT.json]

CKPT: a holotron.train ground output folder with ``aux_heads.pt``. CPU, fp32.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pointer_click import _cell, _in_cell, dev_batch, load, report  # noqa: E402

from holotron.data import generate_sample  # noqa: E402
from holotron.data.eval_report import wilson_interval  # noqa: E402
from holotron.eval import DEV_SEED0  # noqa: E402
from holotron.train.coords import coordinate_box_range  # noqa: E402
from holotron.train.pointer import attention_scores  # noqa: E402

LAMS = (0.25, 0.5, 1.0, 2.0, 4.0)


def methods() -> list[str]:
    return (["greedy", "in cell", "heavy col"] + [f"joint {lam:g}" for lam in LAMS]
            + [f"joint {lam:g} col" for lam in LAMS] + ["rerank 3", "rerank 5"])


def cell_mass(att: torch.Tensor, centres: torch.Tensor, width: float) -> torch.Tensor:
    """(1001,) the attention ``att`` (n_img,) summed over the tokens whose cell on one axis (``centres`` (n_img,)
    0-1000, cells ``width`` wide) contains each value 0..1000."""
    v = torch.arange(1001, dtype=torch.float32)
    inside = (v[None, :] - centres[:, None]).abs() <= width / 2                      # (n_img, 1001)
    return (att[:, None] * inside).sum(0)


def joint(logits: torch.Tensor, mass: torch.Tensor, lam: float) -> int:
    return int((torch.log_softmax(logits, -1) + lam * torch.log(mass + 1e-9)).argmax())


def _role(sample, ranges) -> str:
    """The role of the element whose box gives the answer's value ranges (the question's target)."""
    for e in sample.elements:
        x0, x1, y0, y1 = coordinate_box_range(e.box, sample.size)
        if x0 >= ranges[0] and x1 <= ranges[1] and y0 >= ranges[2] and y1 <= ranges[3]:
            return e.role
    return "?"


def run(folder, n: int = 200, heads: int = 2, first: int = 0, batch_size: int = 8, split: str = "heldout") -> dict:
    folder = Path(folder)
    model, aux, coords, seen, hook = load(folder, "pointer_joint")
    block = model.language_model.backbone.layers[aux.layer + 1]
    coord_t = torch.tensor(coords)
    emb = model.language_model.backbone.embeddings
    names = methods()
    hits = {m: 0 for m in names}
    axis_hits = {m: [0, 0] for m in names}
    per_role: dict[str, dict[str, list[int]]] = {}
    done = 0
    try:
        with torch.no_grad():
            for start in range(0, n, batch_size):
                seeds = [DEV_SEED0 + i for i in range(start, min(n, start + batch_size))]
                ds, batch, is_img, x_emb, firsts = dev_batch(model, folder, seeds, split)
                samples = [generate_sample(s, split=split, **ds.options) for s in seeds]
                pos = batch["image_positions"]
                counts = is_img.sum(1)
                ct = batch["coord_targets"]
                for b in range(len(seeds)):
                    (_, px, xlo, xhi, _), (_, py, ylo, yhi, _) = ct[ct[:, 0] == b][:2].tolist()
                    img = is_img[b].nonzero().squeeze(1)
                    xy = 1000 * pos[firsts[b]: firsts[b] + counts[b]].float()
                    cw = [1000 * _cell(xy[:, a] / 1000) for a in (0, 1)]

                    def at(e, t):
                        h = model.language_model.hidden_states(inputs_embeds=e[None, : t + 1])
                        logits = model.language_model.lm_head(h[0, t])[coord_t]
                        sc = attention_scores(block, seen["h"][:, : t + 1], torch.tensor([[t]]), first + heads)
                        return logits, torch.softmax(sc[0, first:, 0], -1)[:, img].mean(0)

                    def y_after(xv):
                        e = x_emb[b].clone()
                        e[px] = emb.weight[coords[xv]]
                        return at(e, py - 1)

                    lx, ax = at(x_emb[b], px - 1)
                    mass_x = cell_mass(ax, xy[:, 0], cw[0])
                    picks = {"greedy": int(lx.argmax())}
                    picks["in cell"] = _in_cell(lx, float(xy[int(ax.argmax()), 0]), cw[0])
                    picks["heavy col"] = joint(lx, mass_x, 1e4)
                    for lam in LAMS:
                        picks[f"joint {lam:g}"] = picks[f"joint {lam:g} col"] = joint(lx, mass_x, lam)
                    for k in (3, 5):
                        top = ax.topk(k).indices
                        px_cell = []
                        for t in top.tolist():
                            c = float(xy[t, 0])
                            lo, hi = max(0, int(c - cw[0] / 2)), min(1000, int(c + cw[0] / 2) + 1)
                            px_cell.append(float(ax[t]) * float(torch.softmax(lx, -1)[lo: hi + 1].sum()))
                        best = int(top[int(torch.tensor(px_cell).argmax())])
                        picks[f"rerank {k}"] = _in_cell(lx, float(xy[best, 0]), cw[0])
                    ys, cache = {}, {}
                    for m in names:
                        xv = picks[m]
                        if xv not in cache:
                            cache[xv] = y_after(xv)
                        ly, ay = cache[xv]
                        if m == "greedy":
                            ys[m] = int(ly.argmax())
                        elif m in ("in cell",) or m.startswith("rerank"):
                            ys[m] = _in_cell(ly, float(xy[int(ay.argmax()), 1]), cw[1])
                        elif m == "heavy col" or (m.startswith("joint") and m.endswith("col")):
                            col = ((xy[:, 0] - xv).abs() <= cw[0] / 2).float()
                            a = ay * col if col.sum() > 0 else ay
                            lam = 1e4 if m == "heavy col" else float(m.split()[1])
                            ys[m] = joint(ly, cell_mass(a / a.sum().clamp_min(1e-12), xy[:, 1], cw[1]), lam)
                        else:
                            ys[m] = joint(ly, cell_mass(ay, xy[:, 1], cw[1]), float(m.split()[1]))
                    role = _role(samples[b], (xlo, xhi, ylo, yhi))
                    for m in names:
                        okx, oky = xlo <= picks[m] <= xhi, ylo <= ys[m] <= yhi
                        axis_hits[m][0] += okx
                        axis_hits[m][1] += oky
                        hits[m] += okx and oky
                        per_role.setdefault(role, {}).setdefault(m, [0, 0])
                        per_role[role][m][0] += okx and oky
                        per_role[role][m][1] += 1
                    done += 1
                print(f"{done} screens: " + ", ".join(f"{m} {hits[m] / done:.3f}" for m in names), file=sys.stderr)
    finally:
        hook.remove()
    return {"model": str(folder), "split": split, "seeds": f"DEV_SEED0 + 0..{done - 1}", "screens": done,
            "heads": heads, "first": first,
            **{m: {"accuracy": hits[m] / done, "ci95": list(wilson_interval(hits[m], done)),
                   "x_in_box": axis_hits[m][0] / done, "y_in_box": axis_hits[m][1] / done} for m in names},
            "per_role": per_role}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    report(run(a.model, a.n, a.heads, a.first, a.batch), methods(), a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

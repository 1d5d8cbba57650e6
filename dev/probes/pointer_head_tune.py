"""Probe, CPU: train one click-pointer head on the element's own tokens with everything else frozen.

The shipped pointer (query heads 0-1 of the last attention layer) was trained to attend to the element *and* its
label text, so for a text field, a dropdown or a checkbox it points at the label, outside the box
(docs/tiny-model.md). ``--pointer-element-heads`` trains such a head on the GPU with the whole model; this probe
asks, on this CPU, how far the query rows of one head alone get: the residual stream entering that layer is
computed once per screen by the frozen model (training looks, new seeds; ``top_tune.collect``) and kept; then only
the ``--head``'s rows of ``q_proj`` (head_dim x hidden) learn, by the element-only pointer loss
(``attention_pointer_loss``'s positives ``pointer_on_el``) at every answer position. Its keys, values and every
other weight stay as they are, so the model's other heads and layers see the same inputs; the head's own output
changes, which the end-to-end eval of the written checkpoint measures.

    python dev/probes/pointer_head_tune.py CKPT OUT [--screens 960] [--head 1] [--epochs 4] [--lr 3e-3]

CKPT: a ground checkpoint folder with ``aux_heads.pt``; OUT gets the checkpoint with the tuned rows and
``"click_pointer": {"layer": L, "heads": 1, "first": HEAD}``, plus ``pointer_head_tune.json`` (the hit rates
of the head on the last 10% of the screens, held out of the fit, before and after).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pointer_click import load  # noqa: E402
from top_tune import SEED0, collect  # noqa: E402


def head_loss(block, item: dict, head: int, w_rows: torch.Tensor, k: torch.Tensor | None = None):
    """(element-only pointer loss of query head ``head`` with q_proj rows ``w_rows``, hits, positions)."""
    attn = block.mixer
    hd, r = attn.head_dim, attn.n_heads // attn.n_kv_heads
    h = item["h"].float().index_select(0, item["pointer_rows"])                              # the rows asked
    R, T, _ = h.shape
    at, valid = item["pointer_at"], item["pointer_valid"]
    u = block.norm(h)
    if k is None:
        k = attn.k_proj(u).view(R, T, attn.n_kv_heads, hd)[:, :, head // r]                  # (R, T, hd)
    uq = u.gather(1, at[..., None].expand(-1, -1, u.shape[-1]))                               # (R, P, D)
    q = uq @ w_rows.T                                                                        # (R, P, hd)
    scores = torch.einsum("rpd,rtd->rpt", q, k) / math.sqrt(hd)
    visible = torch.arange(T)[None, None, :] <= at[..., None]
    scores = scores.masked_fill(~visible, float("-inf"))
    P = at.shape[1]
    on = torch.zeros(R * P * T, dtype=torch.bool).index_fill_(0, item["pointer_on_el"], True).view(R, P, T)
    on &= visible & valid[..., None]
    ok = valid & on.any(-1)
    lse = torch.logsumexp(scores, -1)
    lse_on = torch.logsumexp(scores.masked_fill(~on, -1e30), -1)     # finite where no positive (masked next)
    loss = torch.where(ok, lse - lse_on, 0.0).sum() / ok.sum().clamp_min(1)
    hits = (on.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1) & ok).sum()
    return loss, int(hits), int(ok.sum()), k


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--screens", type=int, default=960)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--head", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args(argv)
    folder, out = Path(a.model), Path(a.out)
    model, aux, _, seen, hook = load(folder, "pointer_head_tune")
    layer = aux.layer + 1
    block = model.language_model.backbone.layers[layer]
    attn = block.mixer
    hd = attn.head_dim
    rows = slice(a.head * hd, (a.head + 1) * hd)
    t0 = time.time()
    items = collect(model, folder, seen, a.screens, a.batch, a.queries)
    hook.remove()
    collect_s = time.time() - t0
    n_val = max(1, len(items) // 10)
    fit, val = items[:-n_val], items[-n_val:]
    w0 = attn.q_proj.weight.detach()[rows].clone()
    w = torch.nn.Parameter(w0.clone())
    opt = torch.optim.AdamW([w], lr=a.lr, weight_decay=0.0)
    keys = [None] * len(fit)  # each batch's keys: computed at its first use (k_proj is frozen)

    def evaluate(wr):
        hits = n = 0
        with torch.no_grad():
            for it in val:
                _, hh, nn_, _ = head_loss(block, it, a.head, wr)
                hits, n = hits + hh, n + nn_
        return hits / max(1, n)

    before = evaluate(w0)
    history = []
    steps = a.epochs * len(fit)
    step = 0
    for ep in range(a.epochs):
        tot, hits, n = 0.0, 0, 0
        for i in torch.randperm(len(fit)).tolist():
            lr = a.lr * min(1.0, (step + 1) / 20) * (0.5 * (1 + math.cos(math.pi * step / steps)))
            for g in opt.param_groups:
                g["lr"] = lr
            loss, hh, nn_, k = head_loss(block, fit[i], a.head, w, keys[i])
            keys[i] = k.detach()
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot, hits, n, step = tot + float(loss), hits + hh, n + nn_, step + 1
        history.append({"epoch": ep + 1, "loss": tot / len(fit), "fit_hits": hits / max(1, n),
                        "val_hits": evaluate(w.detach())})
        print(history[-1], file=sys.stderr)
    with torch.no_grad():
        attn.q_proj.weight[rows] = w.detach()
    shutil.copytree(folder, out, dirs_exist_ok=False)
    import holotron

    gen = json.loads((folder / "generation_config.json").read_text())
    gen["click_pointer"] = {"layer": layer, "heads": 1, "first": a.head}
    for f in out.glob("model*.safetensors*"):
        f.unlink()
    holotron.save_pretrained(model.to(torch.bfloat16), out, max_shard_size="8MB")  # the checkpoint's dtype
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    rep = {"model": str(folder), "screens": a.screens, "seeds": f"{SEED0} + 0..{a.screens - 1} (split train)",
           "head": a.head, "layer": layer, "epochs": a.epochs, "lr": a.lr, "collect_s": collect_s,
           "val_screens": sum(it["h"].shape[0] for it in val), "val_hits_before": before, "history": history,
           "weight_change_rel": float((w.detach() - w0).norm() / w0.norm())}
    (out / "pointer_head_tune.json").write_text(json.dumps(rep, indent=1))
    print(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

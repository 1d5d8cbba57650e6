"""Probe, CPU: fine-tune the layers above the click pointer's input on cached activations.

The tiny model cannot be trained on this CPU (a ground step at 1,024 px does not fit 24 GB in fp32, and a screen
costs about 1 s of ViT alone). Everything below the last attention layer can stay frozen, though: the residual
stream entering that layer is computed once per screen (training looks, new seeds) and kept, and the last two
layers (the attention layer holding the pointer heads, the MLP after it) learn from it with the ground stage's
losses: the answer (the in-box loss on the coordinates, ``losses._answer_with_boxes``) and the attention pointer
on ``--pointer-heads`` heads, the last ``--element-heads`` of them on the element's own tokens
(``attention_pointer_loss``). A tenth of the screens is held out of the fit: the teacher-forced in-box rate and
the pointer's hit rate on them before and after say whether it learned or memorised.

    python dev/probes/top_tune.py CKPT OUT --cache FILE [--screens 1280] [--epochs 4] [--lr 3e-4]
        [--train attn|attn+mlp] [--element-heads 1] [--from-layer K]
        [--extra-cache FILE --extra-first 1280 --extra-screens 384 --pad-aug 0.5]
        [--screen-options '{"tables": true, "icon_places": true, "font": "mixed"}']

CKPT: a ground checkpoint folder with ``aux_heads.pt``. ``--cache``: the activations (collected once, about
1.1 s a screen here; reused when the file exists). OUT: the checkpoint with the tuned layers (bf16, as shipped)
and ``"click_pointer"`` set to the element-only heads when there are any, plus ``top_tune.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pointer_click import load  # noqa: E402

from holotron.attention import causal_mask  # noqa: E402
from holotron.processor import Processor  # noqa: E402
from holotron.state import Positions  # noqa: E402
from holotron.tokenizer import coordinate_token_ids  # noqa: E402
from holotron.train.augment import pad_sample  # noqa: E402
from holotron.train.batches import ScreenBatches, step_indices  # noqa: E402
from holotron.train.losses import _answer_with_boxes  # noqa: E402
from holotron.train.pointer import attention_pointer_loss  # noqa: E402
from holotron.train.tiles import normalize_tiles  # noqa: E402

SEED0 = 900_000_000  # training looks on seeds no training stream drew (their first seeds lie far below 10**9)
LAYOUT = ("pointer_rows", "pointer_at", "pointer_valid", "pointer_on", "pointer_on_el", "pointer_len", "pointer_slots")


def collect(model, folder, seen, n_screens: int, batch: int, queries: int, first: int = 0,
            pad_aug: float = 0.0, options: dict | None = None) -> list[dict]:
    """Per batch of training-look screens (seeds SEED0 + first ..): the residual stream entering the cached layer
    up to the last answer position (bf16), the answer positions and labels, the coordinate targets, the pointer's
    layout. ``pad_aug``: the share of screens padded on one axis as the ground stage does (``pad_sample``).
    ``options``: more ``generate_sample`` options of the training screens (``tables``, ``icon_places``, ``font``)."""
    out, t0 = [], time.time()
    pad = functools.partial(pad_sample, p=pad_aug) if pad_aug > 0 else None
    with torch.no_grad():
        for start in range(0, n_screens, batch):
            seeds = [SEED0 + first + i for i in range(start, min(n_screens, start + batch))]
            ds = ScreenBatches(folder, model.config.vision, len(seeds), queries=queries, split="train",
                               options={"vocab": "train", **(options or {})}, short_followups=True, seeds=seeds,
                               pointer_element=True, pad=pad)
            b = ds[0]
            ind = step_indices(b, model.config.image_token_id)
            pixels = normalize_tiles(b["pixel_values"], model.config.vision, None, b["num_tiles"])
            model.language_model.hidden_states(inputs_embeds=model.embed_inputs(b["input_ids"], pixels))
            B, T = b["input_ids"].shape
            Tp = ind["pointer_len"]
            flat = ind["answer_index"]
            keep = flat % T < Tp
            row, t = flat // T, flat % T
            item = {"h": seen["h"][:, :Tp].to(torch.bfloat16).clone(), "answer": (row * Tp + t)[keep],
                    "labels": ind["answer_labels"][keep], **{k: ind[k] for k in LAYOUT}}
            # coordinates: rows of "answer" (renumbered after the cut, which keeps every answer position)
            assert bool(keep.all()), "an answer position beyond the pointer's length"
            item["coord_rows"], item["coord_targets"] = ind["coord_rows"], b["coord_targets"]
            out.append(item)
            print(f"{start + len(seeds)} screens cached, {time.time() - t0:.0f} s", file=sys.stderr)
    return out


def losses(lm, layer: int, item: dict, coord_ids, heads: int, element_heads: int, start: int | None = None) -> dict:
    """The answer loss, the pointer loss and the teacher-forced rates of one cached batch through the top.
    ``start``: the layer whose input the cache holds (the pointer layer ``layer`` when None)."""
    layers = lm.backbone.layers
    start = layer if start is None else start
    x = item["h"].float()
    T = x.shape[1]
    where = Positions(mask=None, attn_mask=causal_mask(T, T, None, x.device), pos=0)
    h = x
    for i in range(start, len(layers)):
        if i == layer:
            h = x  # the pointer layer's input
        x = layers[i](x, None, where)
    hf = lm.backbone.norm_f(x)
    logits = lm.lm_head(hf.flatten(0, 1).index_select(0, item["answer"])).float()
    parts: dict = {}
    l_ans = _answer_with_boxes(logits, item["labels"], item["coord_rows"], item["coord_targets"], coord_ids, parts)
    l_ptr, acc = attention_pointer_loss(layers[layer], h, item, heads, element_heads)
    return {"answer": l_ans, "pointer": l_ptr, "pointer_acc": acc, **parts}


def evaluate(lm, layer, items, coord_ids, heads, element_heads, start=None) -> dict:
    tot: dict = {}
    with torch.no_grad():
        for it in items:
            for k, v in losses(lm, layer, it, coord_ids, heads, element_heads, start).items():
                tot[k] = tot.get(k, 0.0) + float(v) / len(items)
    return tot


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--cache", required=True)
    ap.add_argument("--screens", type=int, default=1280)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--train", choices=["attn", "attn+mlp"], default="attn+mlp")
    ap.add_argument("--pointer-heads", type=int, default=2)
    ap.add_argument("--element-heads", type=int, default=1)
    ap.add_argument("--pointer-weight", type=float, default=0.5)
    ap.add_argument("--from-layer", type=int, default=None,
                    help="train every layer from this one up (default: the pointer layer); the cache then holds "
                         "the residual stream entering it")
    ap.add_argument("--extra-cache",
                    help="more cached screens for the fit only (the held-out fit screens stay --cache's last tenth); "
                         "collected with --extra-first / --extra-screens / --pad-aug when the file does not exist")
    ap.add_argument("--extra-first", type=int, default=1280, help="first seed offset of a new --extra-cache")
    ap.add_argument("--extra-screens", type=int, default=384)
    ap.add_argument("--pad-aug", type=float, default=0.0, help="share of a new --extra-cache's screens padded")
    ap.add_argument("--screen-options", default="{}",
                    help='JSON of generate_sample options for new caches, as holotron.train\'s screen options: '
                         '\'{"tables": true, "icon_places": true, "font": "mixed"}\'')
    ap.add_argument("--collect-only", action="store_true")
    a = ap.parse_args(argv)
    try:
        screen_opts = json.loads(a.screen_options)
    except json.JSONDecodeError as e:
        raise SystemExit(f"top_tune: --screen-options is not JSON ({e}): pass e.g. '{{\"tables\": true}}'")
    if not isinstance(screen_opts, dict) or set(screen_opts) - {"tables", "icon_places", "font"}:
        raise SystemExit(f"top_tune: --screen-options takes tables, icon_places and font, got {a.screen_options}")
    folder, out = Path(a.model), Path(a.out)
    model, aux, _, seen, hook = load(folder, "top_tune")
    lm = model.language_model
    layer = aux.layer + 1
    start = layer if a.from_layer is None else a.from_layer
    if not 0 < start <= layer:
        raise SystemExit(f"top_tune: --from-layer must be in 1..{layer} (the pointer layer), got {start}")
    hook.remove()  # keep the residual entering `start` (load's hook keeps the pointer layer's)
    hook = lm.backbone.layers[start - 1].register_forward_hook(lambda m, i, o: seen.__setitem__("h", o))
    t0 = time.time()

    def cached(path: Path, **kw) -> list[dict]:  # a list of dicts of tensors and ints, each tagged with its layer
        if not path.exists():
            got = collect(model, folder, seen, batch=a.batch, queries=a.queries, **kw)
            tmp = path.with_name(path.name + ".tmp")  # no half-written cache if stopped while saving
            torch.save([{**it, "from_layer": start} for it in got], tmp)
            tmp.replace(path)
        got = torch.load(path, weights_only=True)
        if got and got[0].get("from_layer", layer) != start:  # caches before the tag hold the pointer layer's input
            raise SystemExit(f"top_tune: {path} holds the input of layer {got[0].get('from_layer', layer)}, "
                             f"not of --from-layer {start}: pass another --cache file")
        return got

    items = cached(Path(a.cache), n_screens=a.screens, options=screen_opts)
    extra = []
    if a.extra_cache:
        n_main = sum(it["h"].shape[0] for it in items)
        if a.extra_first < n_main:
            raise SystemExit(f"top_tune: --extra-first {a.extra_first} reuses the seeds of --cache (0..{n_main - 1})")
        extra = cached(Path(a.extra_cache), n_screens=a.extra_screens, first=a.extra_first, pad_aug=a.pad_aug,
                       options=screen_opts)
    hook.remove()
    collect_s = time.time() - t0
    if a.collect_only:
        return 0
    coord_ids = torch.tensor(coordinate_token_ids(Processor.from_pretrained(folder)))
    n_val = max(1, len(items) // 10)
    fit, val = items[:-n_val] + extra, items[-n_val:]
    for p in model.parameters():
        p.requires_grad_(False)
    train = list(lm.backbone.layers[start:layer + 1])
    if a.train == "attn+mlp":
        train.append(lm.backbone.layers[layer + 1])
    params = [p for m in train for p in m.parameters()]
    for p in params:
        p.requires_grad_(True)
    before_w = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
    args = (lm, layer)
    ptr = (a.pointer_heads, a.element_heads, start)
    before = evaluate(*args, val, coord_ids, *ptr)
    print("before", before, file=sys.stderr)
    history, steps, step = [], a.epochs * len(fit), 0
    for ep in range(a.epochs):
        t1, tot = time.time(), 0.0
        for i in torch.randperm(len(fit)).tolist():
            lr = a.lr * min(1.0, (step + 1) / 20) * (0.5 * (1 + math.cos(math.pi * step / steps)))
            for g in opt.param_groups:
                g["lr"] = lr
            parts = losses(*args, fit[i], coord_ids, *ptr)
            loss = parts["answer"] + a.pointer_weight * parts["pointer"]
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot, step = tot + float(loss.detach()), step + 1
        history.append({"epoch": ep + 1, "fit_loss": tot / len(fit), "s": time.time() - t1,
                        "val": evaluate(*args, val, coord_ids, *ptr)})
        print(history[-1], file=sys.stderr)
    change = float(torch.stack([(p.detach() - w).norm() ** 2 for p, w in zip(params, before_w)]).sum().sqrt()
                   / torch.stack([w.norm() ** 2 for w in before_w]).sum().sqrt())
    import holotron

    shutil.copytree(folder, out, dirs_exist_ok=False)
    for f in out.glob("model*.safetensors*"):
        f.unlink()
    holotron.save_pretrained(model.to(torch.bfloat16), out, max_shard_size="8MB")  # the checkpoint's dtype
    gen = json.loads((folder / "generation_config.json").read_text())
    if a.element_heads:
        gen["click_pointer"] = {"layer": layer, "heads": a.element_heads, "first": a.pointer_heads - a.element_heads}
    else:
        gen["click_pointer"] = {"layer": layer, "heads": a.pointer_heads}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    rep = {"model": str(folder), "screens": sum(it["h"].shape[0] for it in items),
           "seeds": f"{SEED0} + 0.. (split train, vocab train)", "layer": layer, "from_layer": start, "train": a.train,
           "epochs": a.epochs, "lr": a.lr, "pointer_heads": a.pointer_heads, "element_heads": a.element_heads,
           "pointer_weight": a.pointer_weight, "collect_s": collect_s,
           "extra_screens": sum(it["h"].shape[0] for it in extra), "extra_cache": a.extra_cache,
           "pad_aug": a.pad_aug, "screen_options": screen_opts, "val_screens": sum(it["h"].shape[0] for it in val),
           "val_before": before, "history": history,
           "weight_change_rel": change, "click_pointer": gen["click_pointer"]}
    (out / "top_tune.json").write_text(json.dumps(rep, indent=1))
    print(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

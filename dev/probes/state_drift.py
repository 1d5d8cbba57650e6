"""How far a 16-bit Mamba state drifts from the fp32 one over a long decode (the ``ssm_dtype`` choice of
``holotron.generate`` / ``Engine``).

    python dev/probes/state_drift.py                                  # the bundled holotron-tiny-ui, CPU
    PYTHONPATH=. python3 dev/probes/state_drift.py --random-12b       # a random bf16 12B, CUDA graphs

One prompt is prefilled once (fp32 state) and loaded into an fp32-state engine and a 16-bit-state one;
both are then fed the same tokens for ``--steps`` steps (teacher forcing: the fp32 engine's own greedy
tokens), and each step's logits compared: max |difference| (absolute, and over max |logit|), the argmax
agreement, KL(p_fp32 || p_16bit). Reported over all steps and over the first and last 10%, so that a
drift that grows with the sequence shows. JSON to --out (or $OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from holotron.engine import Engine  # noqa: E402


def drift(model, prompt: torch.Tensor, steps: int, dtypes) -> dict:
    engs = {dt: Engine(model, max_batch=1, max_len=prompt.numel() + steps + 8, ssm_dtype=dt, keep_logits=True)
            for dt in (torch.float32, *dtypes)}
    ref = engs[torch.float32]
    with torch.inference_mode():
        pre = ref.prefix(prompt)
        for e in engs.values():
            e.state.load(0, pre.state, 0)
            e.active[0] = 1
        tok = pre.logits.argmax()
        per = {dt: {"max_abs": [], "rel": [], "agree": [], "kl": []} for dt in dtypes}
        for _ in range(steps):
            for e in engs.values():
                e.tokens[0] = tok
                e.graphs[1].replay() if e.cuda_graph else e._step(1)
            a = ref.logits[0]
            la = a.log_softmax(-1)
            for dt in dtypes:
                b = engs[dt].logits[0]
                d = (b - a).abs().max()
                per[dt]["max_abs"].append(float(d))
                per[dt]["rel"].append(float(d / a.abs().max()))
                per[dt]["agree"].append(bool(a.argmax() == b.argmax()))
                per[dt]["kl"].append(float((la.exp() * (la - b.log_softmax(-1))).sum()))
            tok = a.argmax()
    out = {}
    tenth = max(1, steps // 10)
    for dt, v in per.items():
        def summ(sl):
            return {"max_abs_logit_diff": max(v["max_abs"][sl]),
                    "median_abs_logit_diff": statistics.median(v["max_abs"][sl]),
                    "max_rel_logit_diff": max(v["rel"][sl]),
                    "argmax_agree": sum(v["agree"][sl]) / len(v["agree"][sl]),
                    "mean_kl": statistics.fmean(v["kl"][sl]), "max_kl": max(v["kl"][sl])}
        out[str(dt).split(".")[-1]] = {"all": summ(slice(None)), "first_10pct": summ(slice(0, tenth)),
                                       "last_10pct": summ(slice(steps - tenth, steps))}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens (random ids)")
    ap.add_argument("--random-12b", action="store_true", help="a random bf16 12B on CUDA instead of the tiny model")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    torch.manual_seed(0)
    t = time.perf_counter()
    if args.random_12b:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
        from bench_serving import build

        from holotron.config import TextConfig
        model, name = build(TextConfig(), torch.device("cuda"), torch.bfloat16), "random 12B (bf16 weights)"
    else:
        import holotron
        model = holotron.load("holotron-tiny-ui")
        name = f"holotron-tiny-ui (trained, {str(model.language_model.dtype).split('.')[-1]} weights, CPU)"
    lm = getattr(model, "language_model", model)
    prompt = torch.randint(3, lm.config.vocab_size, (args.prompt,), device=lm.device)
    res = {"model": name, "steps": args.steps, "prompt_tokens": args.prompt, "torch": torch.__version__,
           "device": torch.cuda.get_device_name() if lm.device.type == "cuda" else "cpu",
           "drift": drift(model, prompt, args.steps, (torch.bfloat16, torch.float16))}
    res["seconds"] = time.perf_counter() - t
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "state_drift" + ("_12b" if args.random_12b else "_tiny") + ".json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{name}: {args.steps} teacher-forced steps, 16-bit Mamba state against fp32")
    print(f"{'state':>9} {'part':>11} {'max |dl|':>9} {'median':>9} {'max rel':>9} {'argmax':>8} {'mean KL':>10} "
          f"{'max KL':>10}")
    for dt, parts in res["drift"].items():
        for part, s in parts.items():
            print(f"{dt:>9} {part:>11} {s['max_abs_logit_diff']:9.4f} {s['median_abs_logit_diff']:9.4f} "
                  f"{s['max_rel_logit_diff']:9.2e} {s['argmax_agree']:8.2%} {s['mean_kl']:10.2e} {s['max_kl']:10.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

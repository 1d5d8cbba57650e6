"""FP8 weights against bf16: logit error and greedy agreement (holotron/quant.py).

    python dev/probes/fp8_accuracy.py --tiny [--tokens 24]        # the bundled trained tiny model, CPU
    python dev/probes/fp8_accuracy.py --big [--tokens 32]         # a random 12B-shaped LM on CUDA

For each prompt: the bf16 model prefills and decodes ``--tokens`` greedy tokens; the FP8 model (the same
bf16 weights through ``quantize_``) prefills the same prompt and then decodes the bf16 model's tokens
(teacher forcing, one token per call: on CUDA that is the GEMV kernel's path). Figures, per prompt and
pooled: relative RMS of the logit difference (||l8 - l16|| / ||l16||), max |l8 - l16|, top-1 agreement of
the decode steps under teacher forcing, and the free-running greedy agreement (tokens equal before the
first divergence when the FP8 model decodes on its own). Twice: lm_head kept in bf16 (the default of
``load(quantize="fp8")``) and lm_head quantised too (the same hidden states through an FP8 copy of
lm_head). For scale, the bf16 model against fp32 on the same tokens (``--tiny`` only, the CPU has both).
Random weights (``--big``) say little about quality: they test the numerics at the real shapes.
JSON goes to ``$OUT/fp8_accuracy_tiny_{device}.json`` / ``fp8_accuracy_big.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch

import holotron
from holotron.quant import FP8Linear, quantize_


def _lm(model):
    return getattr(model, "language_model", model)


@torch.no_grad()
def run(model, prompt: dict, tokens: int, forced: list[int] | None = None, qhead=None):
    """Prefill ``prompt`` then ``tokens`` decode steps (greedy, or fed ``forced``). Returns the prefill logits
    (T, V), the decode-step logits (tokens, V), the tokens fed / chosen, and the decode logits through
    ``qhead`` (a quantised lm_head) when given."""
    lm = _lm(model)
    ids = prompt["input_ids"]
    state = model.new_state(ids.shape[0])
    kw = {"pixel_values": prompt["pixel_values"]} if "pixel_values" in prompt else {}
    pre = model(ids, state=state, **kw)[0].float()
    nxt = int(pre[-1].argmax())
    steps, stepsq, out = [], [], []
    for i in range(tokens):
        tok = forced[i] if forced is not None else nxt
        out.append(tok)
        h = lm.hidden_states(torch.tensor([[tok]], device=ids.device), state=state)
        steps.append(lm.lm_head(h)[0, -1].float())
        if qhead is not None:
            stepsq.append(qhead(h)[0, -1].float())
        nxt = int(steps[-1].argmax())
    first = pre[-1:]
    return (pre, torch.cat([first, torch.stack(steps[:-1])]) if tokens else first, out,
            torch.stack(stepsq) if stepsq else None)


def compare(ref: torch.Tensor, got: torch.Tensor) -> dict:
    d = (got - ref).double()
    return dict(rel_rms=float(d.norm() / ref.double().norm()), max_abs=float(d.abs().max()),
                top1=float((got.argmax(-1) == ref.argmax(-1)).double().mean()), n=int(ref.shape[0]))


def agreement(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def probe(ref_model, q_model, prompts: dict, tokens: int, stop=(), decode=None) -> dict:
    """ref_model (bf16) and q_model (FP8, lm_head bf16) on each prompt; see the module docstring."""
    qhead = FP8Linear.from_linear(_lm(q_model).lm_head)
    out = {}
    for name, p in prompts.items():
        pre16, dec16, toks16, _ = run(ref_model, p, tokens)
        # decode logits aligned with the tokens they choose: step i's logits pick toks16[i]
        pre8, dec8, _, _ = run(q_model, p, tokens, forced=toks16)
        _, _, toks8, _ = run(q_model, p, tokens)
        # the quantised-lm_head variant: hidden states of the FP8 model through an FP8 lm_head
        _, _, _, decq = run(q_model, p, tokens, forced=toks16, qhead=qhead)
        row = dict(prompt_tokens=int(p["input_ids"].shape[1]),
                   prefill=compare(pre16, pre8),
                   decode=compare(dec16[1:], dec8[1:]) if tokens > 1 else None,
                   decode_qhead=compare(dec16[1:], decq[:-1]) if tokens > 1 else None,
                   greedy_agree=0, greedy_of=tokens)
        ends = [i + 1 for i, t in enumerate(toks16) if t in stop]  # agreement up to the bf16 answer's end
        row["greedy_of"] = ends[0] if ends else tokens
        row["greedy_agree"] = agreement(toks16[:row["greedy_of"]], toks8[:row["greedy_of"]])
        if decode is not None:
            row["text_bf16"], row["text_fp8"] = decode(toks16[:row["greedy_of"]]), decode(toks8[:row["greedy_of"]])
        out[name] = row
        print(f"{name:>14}: T={row['prompt_tokens']:4d}  prefill rel-RMS {row['prefill']['rel_rms']:.4f} "
              f"max {row['prefill']['max_abs']:.3f} top1 {row['prefill']['top1']:.3f}  | decode rel-RMS "
              f"{row['decode']['rel_rms']:.4f} top1 {row['decode']['top1']:.3f} (lm_head fp8: "
              f"{row['decode_qhead']['rel_rms']:.4f}, top1 {row['decode_qhead']['top1']:.3f})  | greedy "
              f"{row['greedy_agree']}/{row['greedy_of']}", flush=True)
        if decode is not None:
            print(f"{'':>16}bf16 {row['text_bf16']!r}  fp8 {row['text_fp8']!r}")
    return out


def tiny(tokens: int, device: str = "cpu") -> dict:
    from holotron import Processor
    from holotron.bundled import example_image
    from holotron.grounding import localization_messages

    torch.set_num_threads(2)
    proc = Processor.from_pretrained("holotron-tiny-ui")
    shot = example_image()
    prompts = {}
    for ask in ("the Upload button", "the search field", "the Cancel button"):
        prompts[ask] = dict(proc(localization_messages(ask), images=[shot]))
    prompts["text only"] = dict(proc([{"role": "user", "content": "Describe the screen."}]))
    for p in prompts.values():
        p.pop("attention_mask", None)
        p.pop("num_tiles", None)
    ref = holotron.load("holotron-tiny-ui", dtype=torch.bfloat16, device=device)
    q = holotron.load("holotron-tiny-ui", dtype=torch.bfloat16, quantize="fp8", device=device)
    y = holotron.load("holotron-tiny-ui", dtype=torch.float32, device=device)
    for p in prompts.values():
        for key, v in list(p.items()):
            if isinstance(v, torch.Tensor):
                p[key] = v.to(device)
    for p in prompts.values():
        if "pixel_values" in p:
            p["pixel_values"] = p["pixel_values"].to(torch.bfloat16)
    res = probe(ref, q, prompts, tokens, stop=set(proc.stop_token_ids), decode=proc.decode)
    # the fp32 yardstick needs fp32 pixels: a second pass on the same prompts
    for name, p in prompts.items():
        p32 = dict(p, **({"pixel_values": p["pixel_values"].float()} if "pixel_values" in p else {}))
        pre32 = run(y, p32, 0)[0]
        pre16 = run(ref, p, 0)[0]
        pre8 = run(q, p, 0)[0]
        res[name]["bf16_vs_fp32_prefill"] = compare(pre32, pre16)
        res[name]["fp8_vs_fp32_prefill"] = compare(pre32, pre8)
        print(f"{name:>14}: vs fp32: bf16 rel-RMS {res[name]['bf16_vs_fp32_prefill']['rel_rms']:.4f}, "
              f"fp8 rel-RMS {res[name]['fp8_vs_fp32_prefill']['rel_rms']:.4f}")
    return dict(model="holotron-tiny-ui (bundled, trained)", device=device, tokens=tokens, prompts=res)


@torch.no_grad()
def random_12b(device="cuda", seed=0) -> torch.nn.Module:
    """The 12B configuration's HybridLM with random bf16 weights drawn on the GPU (the init_weights recipe of
    holotron/lm.py: linear N(0, 0.02), residual outputs / sqrt(2 L), Mamba A in [-16, -1], dt log-uniform)."""
    from holotron.config import TextConfig
    from holotron.lm import HybridLM
    from holotron.weights import _no_init

    cfg = TextConfig()
    with torch.device("meta"), _no_init():
        model = HybridLM(cfg)
    model = model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "A_log":
            p.copy_(torch.log(1 + 15 * torch.rand(p.shape, generator=g, device=device)))
        elif leaf == "dt_bias":
            u = torch.rand(p.shape, generator=g, device=device)
            dt = torch.exp(math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * u)
            p.copy_(dt + torch.log(-torch.expm1(-dt)))
        elif leaf in ("D",) or p.dim() == 1 and "conv1d" not in name:
            p.fill_(1.0) if leaf != "bias" else p.zero_()
        elif "conv1d" in name:
            p.copy_(torch.randn(p.shape, generator=g, device=device) * (0.5 if leaf == "weight" else 0.1))
        else:
            std = 0.02 / (math.sqrt(2 * cfg.num_hidden_layers) if name.endswith(
                ("o_proj.weight", "out_proj.weight", "down_proj.weight")) else 1.0)
            p.copy_(torch.randn(p.shape, generator=g, device=device) * std)
    model.to(torch.bfloat16)
    return model.eval()


def big(tokens: int) -> dict:
    t0 = time.perf_counter()
    ref = random_12b()
    g = torch.Generator().manual_seed(1)
    prompts = {f"random {n}": {"input_ids": torch.randint(3, 131072, (1, n), generator=g).cuda()} for n in (16, 256)}
    import copy

    q = quantize_(copy.deepcopy(ref), "fp8")
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"built and quantised in {time.perf_counter() - t0:.1f} s; {peak:.1f} GiB peak", flush=True)
    res = probe(ref, q, prompts, tokens)
    return dict(model="12B-shaped HybridLM (TextConfig defaults), random bf16 weights",
                device=torch.cuda.get_device_name(), tokens=tokens, prompts=res)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--device", default="cpu", help="--tiny on this device (cuda: the GPU paths, W8A8 prefill)")
    a = ap.parse_args()
    for name, fn in (("tiny", lambda t: tiny(t, a.device)), ("big", big)):
        if getattr(a, name):
            res = fn(a.tokens)
            res.update(torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
            path = Path(a.out) / f"fp8_accuracy_{name}{'_' + a.device if name == 'tiny' else ''}.json"
            path.write_text(json.dumps(res, indent=1) + "\n")
            print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""``python -m holotron.generate``: one screenshot, one instruction, the answer streamed.

    python -m holotron.generate --model PATH_OR_ID --image shot.png --prompt "Open the settings"
    python -m holotron.generate --model PATH_OR_ID --image shot.png --prompt "Save button" --ground --out click.png
    python -m holotron.generate                    # the bundled tiny model on the bundled example screen

The answer streams to stdout as it is generated (to stderr with ``--json``, where stdout carries one
JSON object). It ends with prefill and decode tokens/s and peak memory. ``--ground`` wraps the prompt
in H Company's localisation format and prints the click in 0-1000 and in pixels of the original
image; ``--out FILE`` draws it on a copy of the screenshot (checked writable before the model loads).
On the CPU a long prompt is prefilled in pieces with a progress line on stderr, and a prompt longer
than the context the model was trained on (config ``max_position_embeddings``) is warned about. When a
grounding model (the bundled one, or a ``holotron.train`` checkpoint) gives no click without
``--ground``, stderr says how to ask it. Errors are one line and a non-zero exit (a traceback only with
``--debug``).

The generation functions live in ``holotron/generation.py`` (this module re-exports them under their
historical import path: ``from holotron.generate import generate, stream``). ``import holotron.generate``
binds the attribute ``holotron.generate`` to this module, so the module is callable:
``holotron.generate(model, ids)`` calls ``generation.generate`` however the package was imported.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import types
from pathlib import Path

from .cli_common import CLIError, check_out_file, cli_device, cli_dtype, write_atomically
from .generation import eos_ids, generate, generate_text, sample, stop_ids, stream

__all__ = ["generate", "generate_text", "stream", "sample", "eos_ids", "stop_ids", "main"]

EXIT_ERROR, EXIT_USAGE = 1, 2
IMAGE_FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".webp": "WEBP", ".bmp": "BMP"}
PREFILL_CHUNK = 256           # tokens per prefill piece on the CPU (a progress step)
PREFILL_PROGRESS_DELAY = 2.0  # seconds of prefill before the progress line shows


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m holotron.generate",
        description="Run a Holotron / Nemotron-Nano VL checkpoint on one image. With no arguments: the "
                    "bundled tiny model on the bundled example screenshot.")
    p.add_argument("--model", help="checkpoint folder or Hugging Face repo id (default: the bundled tiny model)")
    p.add_argument("--image", help="screenshot or picture (PNG, JPEG, ...); default: the bundled example "
                                   "when the model is the bundled one")
    p.add_argument("--prompt", help="the instruction (with --ground: the target to click)")
    p.add_argument("--system", help="system message (e.g. '/no_think')")
    p.add_argument("--ground", action="store_true",
                   help="wrap the prompt in the localisation format and print the click position")
    p.add_argument("--max-new-tokens", type=int, help="default: generation_config.json's, else 256")
    p.add_argument("--temperature", type=float, help="0 = greedy (default unless generation_config samples)")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int, default=0, help="seed for sampling (default 0)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--out", help="with --ground: write a copy of the image with the click drawn on it")
    p.add_argument("--pointer", choices=["auto", "off"], default="auto",
                   help="with --ground: a checkpoint that declares a click pointer writes its coordinates in the cell "
                        "its attention points at (holotron/click_pointer.py); off: plain decoding")
    p.add_argument("--json", action="store_true", help="one JSON result on stdout; logs and the stream on stderr")
    p.add_argument("--debug", action="store_true", help="full tracebacks")
    return p


# ----------------------------------------------------------------------------- pieces


def _peak_memory(device) -> tuple[int, str]:
    """Peak bytes: allocated on the GPU, or the process's peak resident memory on the CPU."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "GPU memory allocated"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process resident memory"


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _held_back(text: str, stops: list[str]) -> int:
    """Length of the longest tail of ``text`` that is the start of a stop string (not printed yet)."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


def _grounding_model(model_id) -> bool:
    """holotron's own grounding checkpoints, trained to answer only with a click: the bundled ones and those
    ``holotron.train`` wrote (they hold trainer_state.json)."""
    from .bundled import MODELS_DIR, bundled_path

    if bundled_path(model_id) is not None:
        return True
    folder = Path(str(model_id)).expanduser()
    if not folder.is_dir():
        return False
    return MODELS_DIR in folder.resolve().parents or (folder / "trainer_state.json").is_file()


def _prefill_progress(n_prompt: int, device):
    """(prefill_chunk, on_prefill, close) for ``stream``: on the CPU a prompt longer than one piece is
    prefilled in pieces, with a tqdm line on stderr once it has taken PREFILL_PROGRESS_DELAY seconds."""
    if device.type != "cpu" or n_prompt <= PREFILL_CHUNK:
        return None, None, lambda: None
    from tqdm.auto import tqdm

    bar = tqdm(total=n_prompt, desc="prefill", unit="tok", file=sys.stderr, delay=PREFILL_PROGRESS_DELAY,
               leave=False, dynamic_ncols=True)

    def on_prefill(done: int, total: int) -> None:
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return PREFILL_CHUNK, on_prefill, bar.close


def _triton_cache_is_warm() -> bool:
    """Whether Triton's on-disk cache already holds holotron's scan kernels (compiled by an earlier run)."""
    cache = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    try:
        return any(cache.glob("*/_chunk_out*.json"))
    except OSError:
        return False


# ----------------------------------------------------------------------------- the job


def run(args, log: logging.Logger) -> dict:
    import torch

    from . import bundled
    from .click_pointer import constraint_for
    from .generation import stop_ids, stream  # looked up at each run (tests replace stream)
    from .grounding import draw_click, localization_messages, parse_click, to_pixels
    from .model import Holotron
    from .processor import Processor
    from .vision.preprocess import load_image
    from .weights import load

    model_id = args.model
    if model_id is None:
        model_id = bundled.default_model()
        if model_id is None:
            raise CLIError("no --model given and this build has no bundled model: pass --model PATH_OR_ID")
        log.info("no --model given: running the bundled tiny model %s", bundled.DEFAULT_MODEL)
    image_path = args.image
    if image_path is None:
        if args.model is not None:
            raise CLIError("--image is required with --model")
        image_path = str(bundled.example_image())
        log.info("no --image given: using the bundled example screenshot %s", image_path)
    prompt = args.prompt
    if prompt is None:
        if args.model is not None or args.image is not None:
            raise CLIError("--prompt is required with --model or --image")
        from .data import EXAMPLE_INSTRUCTION

        prompt, args.ground = EXAMPLE_INSTRUCTION, True
        log.info("no --prompt given: grounding the default instruction %r", prompt)
    if args.out and not args.ground:
        raise CLIError("--out draws the click: use it with --ground")
    out_path = check_out_file(args.out, "--out", IMAGE_FORMATS) if args.out else None  # before any work
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise CLIError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")

    device = cli_device(args.device)
    dtype = cli_dtype(args.dtype, device)
    image = load_image(image_path)  # a clear ImageError for anything unreadable, before loading the model

    log.info("loading %s on %s (%s) ...", model_id, device, str(dtype).replace("torch.", ""))
    t = time.perf_counter()
    model = load(model_id, dtype=dtype, device=device, progress=sys.stderr.isatty())
    processor = Processor.from_pretrained(model_id)
    log.info("loaded in %.1f s (%.1f M parameters)", time.perf_counter() - t, model.num_parameters() / 1e6)
    if not isinstance(model, Holotron):
        raise CLIError(f"{model_id} is a text-only model ({type(model).__name__}): the CLI needs a VL checkpoint")

    if args.ground:
        messages = localization_messages(prompt)
        if args.system is not None:
            messages = [{"role": "system", "content": args.system}] + [m for m in messages if m["role"] != "system"]
    else:
        messages = ([{"role": "system", "content": args.system}] if args.system is not None else []) + [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    batch = processor(messages, images=[image])
    n_prompt = batch["input_ids"].shape[1]
    limit = model.config.max_sequence_length
    if limit and n_prompt >= limit:
        raise CLIError(f"the prompt is {n_prompt} tokens, at or over the model's limit of {limit}: "
                       "shorten the text or use a smaller image")
    trained = getattr(model.config.text, "max_position_embeddings", None)
    if isinstance(trained, int) and n_prompt > trained:  # a warning: the architecture has no position limit
        log.warning("warning: the prompt is %d tokens, longer than the %d the model was trained on "
                    "(max_position_embeddings): answers may degrade", n_prompt, trained)
    batch = batch.to(device, dtype)

    gen = processor.generation_config.generate_kwargs()
    max_new = args.max_new_tokens or gen.get("max_new_tokens") or 256
    if limit:
        max_new = min(max_new, limit - n_prompt)
    temperature = args.temperature if args.temperature is not None else gen.get("temperature", 0.0)
    sampling = temperature > 0
    top_p = args.top_p if args.top_p is not None else (gen.get("top_p") if sampling else None)
    top_k = args.top_k if args.top_k is not None else (gen.get("top_k") if sampling else None)
    if not sampling and (args.top_p is not None or args.top_k is not None):
        raise CLIError("--top-p / --top-k need sampling: pass --temperature > 0")
    eos = stop_ids(model, processor)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        if not _triton_cache_is_warm():
            log.info("compiling the Triton scan kernels for this GPU (first use only; cached afterwards) ...")
    out_stream = sys.stderr if args.json else sys.stdout
    decoder = processor.stream_decoder(skip_special_tokens=True)
    full_decoder = processor.stream_decoder(skip_special_tokens=False)  # for stop strings and the click
    text, raw = "", ""
    n_new, t_first = 0, None
    chunk, on_prefill, close_progress = _prefill_progress(n_prompt, device)
    constrain = None
    if args.ground and args.pointer == "auto":  # a checkpoint's click pointer (holotron/click_pointer.py)
        try:
            constrain = constraint_for(model, processor, batch["input_ids"], [image.size])
        except ValueError as e:
            raise CLIError(str(e)) from None
    t0 = time.perf_counter()
    it = stream(model, batch["input_ids"], max_new, attention_mask=batch["attention_mask"],
                pixel_values=batch["pixel_values"], temperature=temperature, top_p=top_p, top_k=top_k,
                seed=args.seed if sampling else None, eos_token_id=list(eos), pad_token_id=processor.pad_token_id,
                prefill_chunk=chunk, on_prefill=on_prefill, constrain=constrain)
    stopped_by = "length"
    emitted = 0  # characters of ``text`` already written; a tail that may begin a stop string waits

    def emit(upto: int) -> None:
        nonlocal emitted
        if upto > emitted:
            out_stream.write(text[emitted:upto])
            out_stream.flush()
            emitted = upto

    for tok in it:
        tid = int(tok[0])
        if t_first is None:
            t_first = time.perf_counter()
            close_progress()
        n_new += 1
        if tid in eos:
            stopped_by = "eos"
            break
        text += decoder.put(tid)
        raw += full_decoder.put(tid)
        hits = [text.index(s) for s in args.stop if s in text]
        if hits:
            text = text[:min(hits)]
            stopped_by = "stop string"
            break
        emit(len(text) - _held_back(text, args.stop))
    else:
        text += decoder.flush()
        raw += full_decoder.flush()
    emit(len(text))
    close_progress()
    if hasattr(it, "close"):
        it.close()
    if constrain is not None:
        constrain.close()
    t_end = time.perf_counter()
    out_stream.write("\n")
    out_stream.flush()

    prefill_s = (t_first or t_end) - t0
    decode_s = t_end - (t_first or t_end)
    n_decode = max(0, n_new - 1)
    peak, peak_what = _peak_memory(device)
    result = {
        "model": str(model_id), "image": str(image_path), "image_size": list(image.size), "prompt": prompt,
        "text": text, "stopped_by": stopped_by, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
        "prompt_tokens": n_prompt, "new_tokens": n_new,
        "prefill_seconds": round(prefill_s, 4),
        "prefill_tokens_per_s": round(n_prompt / prefill_s, 1) if prefill_s > 0 else None,
        "decode_seconds": round(decode_s, 4),
        "decode_tokens_per_s": round(n_decode / decode_s, 1) if decode_s > 0 and n_decode else None,
        "peak_memory_bytes": peak, "peak_memory_kind": peak_what,
    }
    if args.ground:
        w, h = image.size
        point = parse_click(text) or parse_click(raw)
        if point is None:
            result["click"] = None
            log.info("no click position could be parsed from the answer")
        else:
            px = to_pixels(point, w, h)
            result["click"] = {"x": point.x, "y": point.y, "x_px": round(px.x, 1), "y_px": round(px.y, 1)}
            if out_path is not None:
                marked = draw_click(image, point).convert("RGB")
                write_atomically(out_path, lambda tmp: marked.save(tmp, format=IMAGE_FORMATS[out_path.suffix.lower()]))
                result["out"] = args.out
    elif _grounding_model(model_id) and parse_click(text) is None and parse_click(raw) is None:
        log.info("%s is a grounding model: it answers with where to click. Ask it with --ground and the target, "
                 "e.g. --ground --prompt %r", model_id, prompt)
    return result


def _report(result: dict, args, log) -> None:
    if args.json:
        sys.stdout.write(json.dumps(result) + "\n")
        return
    click = result.get("click")
    if not result["text"].strip():  # streamed nothing visible: say so rather than leave a blank line
        n = result["new_tokens"]
        log.info("the answer is empty (the model stopped by %s after %d new token%s)",
                 result["stopped_by"], n, "" if n == 1 else "s")
    if args.ground:
        if click is None:
            print("click: none (the answer has no parsable position)")
        else:
            print(f"click: x={click['x']:g}, y={click['y']:g} (0-1000) = ({click['x_px']:.0f}, {click['y_px']:.0f}) px "
                  f"in the {result['image_size'][0]}x{result['image_size'][1]} image")
        if result.get("out"):
            print(f"wrote {result['out']}")
    pf = result["prefill_tokens_per_s"]
    dc = result["decode_tokens_per_s"]
    log.info("prefill: %d tokens in %.2f s (%s tokens/s); decode: %d tokens in %.2f s (%s tokens/s); peak %s: %s",
             result["prompt_tokens"], result["prefill_seconds"], f"{pf:,.0f}" if pf else "-",
             max(0, result["new_tokens"] - 1), result["decode_seconds"], f"{dc:,.1f}" if dc else "-",
             result["peak_memory_kind"], _fmt_bytes(result["peak_memory_bytes"]))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    log = logging.getLogger("holotron.generate")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        result = run(args, log)
        _report(result, args, log)
        return 0
    except KeyboardInterrupt:
        print("holotron.generate: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - one clear line unless --debug
        if args.debug:
            raise
        print(f"holotron.generate: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_ERROR


def _one_line(e: BaseException) -> str:
    import torch

    if isinstance(e, torch.cuda.OutOfMemoryError):
        return ("out of GPU memory: try --dtype bfloat16, a smaller --max-new-tokens or a smaller image "
                "(fewer tiles); run with --debug for details")
    msg = str(e).strip()
    if isinstance(e, (CLIError, ValueError, FileNotFoundError, OSError)) and msg:
        lines = msg.splitlines()  # grouped checkpoint errors are a short screen: show it whole
        return msg if len(lines) <= 12 else "\n".join(lines[:12]) + f"\n... ({len(lines) - 12} more lines)"
    return (f"{type(e).__name__}: {msg.splitlines()[0] if msg else 'unexpected failure'} "
            "(run with --debug for the traceback)")


class _CallableModule(types.ModuleType):
    """Forwards calls to ``generate`` (see the module docstring)."""

    def __call__(self, *args, **kwargs):
        return generate(*args, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
else:
    sys.modules[__name__].__class__ = _CallableModule

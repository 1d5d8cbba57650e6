"""How fast one data worker makes the ground stage's batches: screens rendered, tiled and turned into every
target the recipe's ground options ask for (scripts/train_tiny_ui_v2.sh: 16 short questions a screen, the
pointer's tokens, the matching targets), one thread, as a DataLoader worker runs. The training loop runs
``--workers`` of them; when their screens/s times the workers falls below the step's, the GPU waits for data.

    python dev/probes/ground_data_rate.py [--batch 8] [--batches 6] [--repeats 3] [--tokenizer runs/tok-word] [--tables]
        [--icon-places] [--tab-places] [--fonts mixed] [--loader]

Prints the best of ``--repeats`` timings of ``--batches`` batches (after one untimed batch) as seconds per batch
and screens/s, and a digest of every batch's tensors and values (a change that is only meant to be faster must
keep it); a word tokenizer is built in a temporary folder when none is given. ``--tables``: the screens of
``--tables on`` (holotron/data/tables.py), whose table rows add elements, texts and row-relative questions.
``--icon-places``: the screens of ``--icon-places on`` (holotron/data/icon_places.py), the icons moved.
``--tab-places``: the screens of ``--tab-places on`` (holotron/data/tab_places.py), now and then tabs in a column.
``--fonts mixed``: the screens of ``--fonts mixed`` (holotron/data/faces.py), one face per screen.
``--loader``: through a DataLoader of one worker process, as the training loop receives them (the batch's trip to
the main process included); the digest is the same either way.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import torch
from ground_step_ops import GROUND

from holotron.processor import Processor
from holotron.tokenizer import build_task_tokenizer, coordinate_token_ids
from holotron.train.cli import check_args, parser
from holotron.train.loop import _build_model, _dataset
from holotron.train.presets import make_config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8, help="screens per batch")
    ap.add_argument("--batches", type=int, default=6, help="batches per timing")
    ap.add_argument("--repeats", type=int, default=3, help="timings (the best is printed)")
    ap.add_argument("--tokenizer", default=None, help="a word tokenizer folder (default: one built here)")
    ap.add_argument("--config", default="tiny-ui")
    ap.add_argument("--tables", action="store_true", help="the training screens of --tables on")
    ap.add_argument("--icon-places", action="store_true", help="the training screens of --icon-places on")
    ap.add_argument("--tab-places", action="store_true", help="the training screens of --tab-places on")
    ap.add_argument("--fonts", default="default", choices=["default", "mixed"], help="as holotron.train --fonts")
    ap.add_argument("--loader", action="store_true",
                    help="time the batches as the training loop receives them: a DataLoader of one worker process "
                         "(the batch's transfer to the main process included)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)  # as in a DataLoader worker
    tok = Path(a.tokenizer) if a.tokenizer else build_task_tokenizer(Path(tempfile.mkdtemp()) / "tok", n=200,
                                                                     kind="word")
    args = parser().parse_args([*GROUND, "--batch-size", str(a.batch), "--out", "unused", "--tokenizer", str(tok),
                                "--config", a.config, "--tables", "on" if a.tables else "off",
                                "--icon-places", "on" if a.icon_places else "off",
                                "--tab-places", "on" if a.tab_places else "off", "--fonts", a.fonts])
    check_args(args)
    processor = Processor.from_pretrained(tok)
    config = make_config(args.config, processor.vocab_size, args.set)
    _, aux, _ = _build_model(args, config, torch.device("cpu"), None, coordinate_token_ids(processor))
    data = _dataset(args, config.vision, tok, aux)  # the aux heads switch the matching targets on
    if a.tables:  # what --tables on asks of the stream (a no-op where screen_options passes it already)
        data.options.setdefault("tables", True)
    if a.icon_places:  # the same for --icon-places on
        data.options.setdefault("icon_places", True)
    if a.tab_places:
        data.options.setdefault("tab_places", True)
    times, kept, digest = [], [], hashlib.sha256()
    if a.loader:  # one worker: batch k + 1 arrives one worker's batch time after batch k (prefetching included)
        loader = torch.utils.data.DataLoader(data, batch_size=None, sampler=range(a.repeats * a.batches + 1),
                                             num_workers=1, prefetch_factor=2)
        got = iter(loader)
        next(got)
    else:
        data[0]
    for r in range(a.repeats):
        t = time.perf_counter()
        if a.loader:
            batches = [next(got) for _ in range(a.batches)]
        else:
            batches = [data[1 + r * a.batches + i] for i in range(a.batches)]
        times.append((time.perf_counter() - t) / a.batches)
        kept.append(batches)  # the digest after all timings: a worker prefetches while the main process hashes
    for batches in kept:
        for b in batches:
            for k in sorted(b):
                v = b[k]
                digest.update(k.encode())
                if torch.is_tensor(v):
                    digest.update(f"{v.dtype} {tuple(v.shape)}".encode())
                    digest.update(v.contiguous().numpy().tobytes())
                else:
                    digest.update(repr(v).encode())
    best = min(times)
    tables = ((", tables on" if a.tables else "") + (", icon places on" if a.icon_places else "")
              + (", tab places on" if a.tab_places else "")
              + (f", fonts {a.fonts}" if a.fonts != "default" else "") + (", through a DataLoader" if a.loader else ""))
    print(f"{a.batch} screens a batch, {a.config}{tables}: {best:.3f} s per batch, {a.batch / best:.1f} screens/s per "
          f"worker (one thread; best of {a.repeats} x {a.batches} batches); batches' digest {digest.hexdigest()[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

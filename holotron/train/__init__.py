"""Training holotron VL models on streamed synthetic screens: ``python -m holotron.train``.

    python -m holotron.train --config tiny-ui --steps 3000 --batch-size 32 --out runs/tiny --time-budget 7
    python -m holotron.train --config micro --steps 4 --batch-size 2 --device cpu --out /tmp/m   # a CPU smoke run

The loop, in the order a step runs:
  data      ``ScreenBatches[step]``: batch ``step`` of the stream, rendered in DataLoader worker processes
            (``holotron.data.generate_sample`` with seeds ``seed * 10**12 + step * batch + i``, so a
            batch depends only on (seed, step): runs and resumed runs see the same data). Each screen
            goes through ``holotron.Processor`` exactly as at inference (chat template, ``<img><image>*N
            </img>``, tiling), then the answer tokens are appended. Tiles travel as uint8 and are
            normalised on the device (``normalize_tiles``: the same arithmetic as the preprocessing).
  labels    -100 everywhere except the answer tokens: the click JSON, the newline and the end-of-turn
            token ``<SPECIAL_12>`` (so the model learns to stop). With ``--queries k`` a screen carries
            k questions, as turns of one conversation; the first turn is the inference prompt.
  forward   vision tower + mlp1 + the LM's hidden states; the lm_head runs only at the answer
            positions. Rows are right-padded (pads after the answer change nothing before them, so no
            attention mask is needed and attention stays plain causal).
  update    AdamW (no decay on norms, biases, embeddings and the SSM constants), linear warm-up then
            cosine decay to ``min_lr_ratio * lr`` (``lr_at``), gradient clipping; bf16 autocast on CUDA.
            With ``--time-budget`` the schedule runs on whichever ends first, steps or minutes.
  eval      every ``--eval-every`` steps: point-in-box accuracy on held-out screens by greedy
            generation + ``parse_click`` (``holotron.eval``).
  save      the HF layout (``save_pretrained``: config.json, safetensors shards, preprocessor_config.json,
            generation_config.json) + the tokenizer files + ``trainer_state.json`` (the loss log and
            evals) in ``--out`` at the end (also on a time-budget stop, SIGTERM or Ctrl-C), and in
            ``--out/checkpoint-STEP`` every ``--save-every`` steps (the latest kept); with
            ``--save-optimizer`` also ``training_state.pt`` (fp32 weights + AdamW state) for
            ``--resume``. ``holotron.load`` and ``Processor.from_pretrained`` read the folder as it is.

Options past the plain loop: ``--aux-weight W`` adds dense losses on the image tokens (the text class
under each token, the character under each of its patches, its screen position; ``image_token_targets``,
``char_classes_at``, ``AuxHeads``: training-only heads, written beside the model as aux_heads.pt, never
loaded by ``holotron.load``). ``--stage read`` trains the vision side alone on tile mosaics of text crops
(``reading_tile``, ``ReadingBatches``, ``reading_loss_fn``), colour-augmented, characters alone first and
label classes beside them after ``--labels-after`` of the run (the order the reading probe found to
work, docs/tiny-model.md); ``--init-from DIR`` starts a run from a checkpoint's weights (fresh optimizer)
and, without ``--tokenizer``, its tokenizer.

The scan: ``holotron.kernels.ssd_scan`` picks its backend per device, so on CUDA every Mamba layer
trains through the Triton scan and its Triton backward, on the CPU through the PyTorch ``chunked``
scan (autograd). ``HOLOTRON_SSD_BACKEND=chunked`` in the environment forces the PyTorch scan anywhere.

The package, one concept a file (the names below are re-exported here):
  cli.py         the command line: ``parser``, ``main`` (``python -m holotron.train`` runs __main__.py)
  loop.py        ``train(args)``: the run, top to bottom; ``train_step``: one optimiser step
  inputs.py      --out, the tokenizer, --init-from and the device, checked before any work
  presets.py     ``PRESETS``, ``make_config``, ``init_weights`` (``Holotron.init_weights``)
  optim.py       ``make_optimizer``, ``lr_at`` (cosine or WSD), ``schedule_progress`` (one schedule over jobs)
  tiles.py       ``uint8_tiles``, ``normalize_tiles``, ``colour_aug``, ``augmented_grid``
  augment.py     ``pad_sample`` (``--pad-aug``), ``padded_aspects``
  coords.py      coordinate tokens: ``init_coordinate_embeddings``, ``coordinate_box_range``
  questions.py   ``answer_ids``, ``followup_text``, ``extra_targets``
  targets.py     ``IGNORE``, ``label_class``, ``char_class``, ``char_classes_at``, ``text_classes_at``,
                 ``image_token_targets``, ``pointer_tokens``
  batches.py     ``ScreenBatches``, ``collate``, ``step_indices`` (the loss's positions, found on the host)
  heads.py       ``AuxHeads``
  losses.py      ``loss_fn``
  pointer.py     ``pointer_loss``, ``attention_scores``, ``attention_pointer_loss``, ``answer_spans``,
                 ``pointer_layout``
  reading.py     ``reading_tile``, ``ReadingBatches``, ``reading_loss_fn``, ``tiling_scale``
  matching.py    ``--stage match`` and ``--match-weight``: ``match_targets``, ``match_loss``, ``MatchBatches``
  element_tokens.py  which image tokens show an element: ``element_tokens``, ``element_core_tokens``, ``token_cell``
  evals.py       the evals during a run
  checkpoint.py  ``save_checkpoint``, ``init_from``, ``load_training_state``, ``AUX_FILE``, ``TOKENIZER_FILES``
  profiling.py   ``--profile``
"""

# ruff: noqa: F401  (re-exports: the names tests, probes and notebooks import from holotron.train)
from .batches import ScreenBatches, collate
from .checkpoint import (
    AUX_FILE,
    GENERATION_CONFIG,
    TOKENIZER_FILES,
    init_from,
    load_training_state,
    save_checkpoint,
    trainer_state,
    write_log_csv,
)
from .cli import check_args, main, parser
from .heads import POINTER_DIM, AuxHeads
from .inputs import check_out
from .loop import train
from .losses import loss_fn
from .optim import lr_at, make_optimizer
from .pointer import answer_spans, attention_pointer_loss, attention_scores, pointer_layout, pointer_loss
from .presets import PRESETS, init_weights, make_config
from .questions import answer_ids, extra_targets, followup_text
from .reading import FIT_JITTER, ReadingBatches, reading_loss_fn, reading_tile, tiling_scale
from .targets import (
    AUX_CLASSES,
    IGNORE,
    N_CHAR,
    char_class,
    char_classes_at,
    char_table,
    class_boxes,
    image_token_targets,
    label_class,
    pointer_tokens,
    text_classes_at,
)
from .tiles import GRID_SCALE, GRID_STRETCH, augmented_grid, colour_aug, normalize_tiles, uint8_tiles

__all__ = ["PRESETS", "make_config", "init_weights", "make_optimizer", "lr_at", "ScreenBatches", "collate",
           "normalize_tiles", "uint8_tiles", "answer_ids", "extra_targets", "train", "main"]

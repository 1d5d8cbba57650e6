"""Synthetic GUI screens for training and evaluating grounding.

    from holotron.data import generate_sample, stream, to_messages, corpus
    s = generate_sample(0)                  # Sample(image, elements, instruction, target, answer, ...)
    msgs = to_messages(s)                   # chat messages for holotron.Processor, answer last
    texts = corpus(100)                     # prompt + answer texts for a tokenizer

Files: labels.txt (the vocabulary), labels.py (loading it, unique labels per screen), vocab.py (the held-out
vocabulary ``heldout_vocab()``), styles.py (themes, sizes, font sizes, the train / heldout split), faces.py (the
font faces a screen can use: Aileron, the default, and those bundled in fonts/), canvas.py (recording drawing +
boxes), widgets.py (one control each), context.py (what layouts and blocks draw with),
inputs.py and blocks.py (groups of controls), bars.py (title, menu, tool, tab, status bars and sidebars),
columns.py (content columns), tables.py and table_cells.py (data tables on training screens, their made-up cell
texts), icon_places.py (icons in varied places on training screens), tab_places.py (tabs in columns on training
screens), layouts.py (whole screens: layouts_train.py, layouts_heldout.py, layouts_mosaic.py), instructions.py
(instruction, answer, messages), screens.py (generate_sample, stream, corpus), example.py (the bundled
example_screen.png, EXAMPLE_INSTRUCTION and its EXAMPLE_TARGET), eval_sets.py and eval_report.py (what
``holotron.eval`` reads and writes: examples, the dev and reported seeds, predictions, reports).

Held-out vocabulary: ``generate_sample(seed, vocab="train")`` for training screens that never show a
label of ``heldout_vocab()``, ``vocab="heldout"`` for screens whose target is one (screens.py).
"""

from .canvas import Element, Text
from .example import EXAMPLE_ANSWER, EXAMPLE_INSTRUCTION, EXAMPLE_TARGET, example_path, example_sample
from .instructions import to_messages
from .labels import all_labels, load_labels
from .layouts import LAYOUTS
from .screens import ROLES, Sample, check_sample, corpus, generate_sample, stream
from .styles import SIZES, SPLITS, THEMES
from .vocab import VOCABS, heldout_vocab

__all__ = [
    "Element", "Text", "Sample", "generate_sample", "stream", "to_messages", "corpus", "check_sample",
    "load_labels", "all_labels", "heldout_vocab", "VOCABS", "ROLES", "LAYOUTS", "SIZES", "SPLITS", "THEMES",
    "example_path", "example_sample", "EXAMPLE_INSTRUCTION", "EXAMPLE_TARGET", "EXAMPLE_ANSWER",
]

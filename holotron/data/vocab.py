"""The held-out vocabulary: a fixed ~15% of the distinct labels of labels.txt (lower-cased), chosen by a
stable hash (``zlib.crc32`` of the lower-cased label, not Python's salted ``hash``), minus the texts the
layouts draw by name (``fixed_texts``: icon names, the status bar's words, ...). Screens made with
``vocab="train"`` never show one (``labels.LabelPicker(exclude=heldout_vocab())``); ``vocab="heldout"``
screens name one as their target (screens.generate_sample). It tests whether a model reads the words on a
screen or has learnt the training labels by heart. Held out are whole label strings: a held-out "Save" may
still be read as a word of a training label such as "Save changes".
"""

from __future__ import annotations

import functools
import zlib

from .bars import STATUS_TEXTS
from .labels import all_labels
from .layouts_heldout import WIZARD_BUTTONS
from .layouts_train import CLOCKS, CLOSE_DIALOG
from .widgets import ICONS

HELDOUT_PERCENT = 15  # crc32(label) % 100 below this: held out
VOCABS = ("all", "train", "heldout")  # generate_sample's vocab option


@functools.lru_cache(maxsize=1)
def fixed_texts() -> frozenset[str]:
    """The texts the layouts draw by name (``LabelPicker.claim``), lower-cased: the icons' names (widgets.ICONS,
    "Search" and "Add" among them), the status bar's words (bars.STATUS_TEXTS), the phone clock
    (layouts_train.CLOCKS), "Close dialog" (layouts_train.CLOSE_DIALOG) and the wizard's buttons
    (layouts_heldout.WIZARD_BUTTONS). None is ever held out, so no layout loses a part under vocab="train"."""
    texts = [*ICONS.values(), *STATUS_TEXTS, *CLOCKS, CLOSE_DIALOG, *(t for names in WIZARD_BUTTONS for t in names)]
    return frozenset(t.lower() for t in texts)


def is_heldout_label(label: str) -> bool:
    """The stable hash rule alone (``heldout_vocab`` also leaves out ``fixed_texts``)."""
    return zlib.crc32(label.lower().encode("utf-8")) % 100 < HELDOUT_PERCENT


@functools.lru_cache(maxsize=1)
def heldout_vocab() -> frozenset[str]:
    """The held-out vocabulary: the lower-cased labels of labels.txt that training screens (``vocab="train"``)
    never show (see the module docstring)."""
    return frozenset(s.lower() for s in all_labels() if is_heldout_label(s)) - fixed_texts()

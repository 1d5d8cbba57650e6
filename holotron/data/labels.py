"""The label vocabulary (labels.txt) and the per-screen picker that keeps every visible text unique (and,
for training screens, leaves out the held-out vocabulary of vocab.py)."""

from __future__ import annotations

import functools
import random
from importlib import resources

LABELS_FILE = "labels.txt"


def parse_labels(text: str) -> dict[str, tuple[str, ...]]:
    """Read the labels format: "[group]" headers, one label per line, "#" comments, blank lines ignored."""
    groups: dict[str, list[str]] = {}
    current = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
            if not current or current in groups:
                raise ValueError(f"{LABELS_FILE}:{n}: empty or repeated group [{current}]")
            groups[current] = []
        elif current is None:
            raise ValueError(f"{LABELS_FILE}:{n}: label {line!r} before any [group] header")
        else:
            groups[current].append(line)
    return {k: tuple(dict.fromkeys(v)) for k, v in groups.items()}


@functools.lru_cache(maxsize=1)
def load_labels() -> dict[str, tuple[str, ...]]:
    """{group: labels} from the labels.txt shipped in this package (groups: button, menu, menu item, tab,
    link, field, checkbox, radio, switch, dropdown, list item, title, heading, sentence, value, option,
    placeholder, brand)."""
    text = resources.files(__package__).joinpath(LABELS_FILE).read_text(encoding="utf-8")
    return parse_labels(text)


def all_labels() -> list[str]:
    """Every distinct entry of the vocabulary, in file order."""
    return list(dict.fromkeys(label for group in load_labels().values() for label in group))


@functools.lru_cache(maxsize=2)
def _groups_without(exclude: frozenset[str]) -> dict[str, tuple[str, ...]]:
    return {k: tuple(s for s in v if s.lower() not in exclude) for k, v in load_labels().items()}


class LabelPicker:
    """Draws labels for one screen so that no text appears twice (compared case-insensitively).
    ``exclude``: lower-cased texts never drawn (``take`` skips them, ``claim`` refuses them), e.g.
    ``vocab.heldout_vocab()`` for training screens."""

    def __init__(self, rng: random.Random, exclude: frozenset[str] = frozenset()):
        self.rng = rng
        self.exclude = frozenset(exclude)
        self.groups = _groups_without(self.exclude) if self.exclude else load_labels()
        self.used: set[str] = set()

    def take(self, group: str, fits=None) -> str | None:
        """An unused label of ``group`` for which ``fits(label)`` holds; None when there is none
        (a few random tries first, then a scan in a random order)."""
        pool = self.groups[group]
        if not pool:
            return None
        for _ in range(8):
            label = self.rng.choice(pool)
            if label.lower() not in self.used and (fits is None or fits(label)):
                self.used.add(label.lower())
                return label
        order = list(pool)
        self.rng.shuffle(order)
        for label in order:
            if label.lower() not in self.used and (fits is None or fits(label)):
                self.used.add(label.lower())
                return label
        return None

    def claim(self, label: str) -> bool:
        """Reserve a fixed text (an icon's name, a status word); False when it is already on the screen or
        excluded (then the caller leaves it out or draws something else)."""
        if label.lower() in self.used or label.lower() in self.exclude:
            return False
        self.used.add(label.lower())
        return True

"""The questions and answers of a training screen, as tokens: what the model must write (``answer_ids``), a later
turn of the conversation (``followup_text``), and more questions about other elements of the same screen
(``extra_targets``, for ``--queries``)."""

from __future__ import annotations

import random
import re

from ..chat_template import END_OF_TURN
from ..processor import Processor

__all__ = ["answer_ids", "followup_text", "extra_targets"]


def answer_ids(processor: Processor, answer: str) -> list[int]:
    """What the model must write after the prompt: the answer, a newline and the end-of-turn token,
    as the chat template renders an assistant turn (``{answer}\\n<SPECIAL_12>``)."""
    return processor.encode(answer.strip() + "\n" + END_OF_TURN)


def followup_text(target: str, short: bool = False) -> str:
    """A later turn of the same conversation, as the Nemotron template renders it (reasoning off):
    the newline after the previous end of turn, the user's localisation prompt (with ``short``, the
    target alone: about 10 tokens instead of 170), the assistant header."""
    from ..grounding import localization_prompt

    ask = target.strip() if short else localization_prompt(target).strip()
    return "\n<SPECIAL_11>User\n" + ask + "\n<SPECIAL_11>Assistant\n<think></think>"


def _word(label: str) -> re.Pattern:
    return re.compile(r"(?<![a-z0-9])" + re.escape(label.lower()) + r"(?![a-z0-9])")


def extra_targets(sample, k: int, rng: random.Random, boxes: bool = False) -> list[tuple]:
    """Up to ``k`` more (instruction, answer) pairs for other elements of ``sample``'s screen (with
    ``boxes``, (instruction, answer, element box) triples; the same draws either way).

    An element qualifies when it has a target role, is at least 6 px on each side, its label is in no
    other element's label (as whole words, case-insensitively) and every visible text that holds the
    label lies on or next to the element (its own caption or value). The generator applies the same
    rule with the texts' owners, which a Sample does not keep, so this one errs on the strict side.
    A control of a table row (``Element.row``) qualifies by the generator's own rule for them
    (``tables.row_is_unique``), and its instruction names it through its row (``row_instruction``)."""
    from ..data import ROLES
    from ..data.instructions import answer_text, click_point, instruction_for, row_instruction
    from ..data.tables import row_is_unique

    if k <= 0:
        return []
    w, h = sample.size
    els = [e for e in sample.elements if e is not sample.target and e.role in ROLES
           and min(e.box[2] - e.box[0], e.box[3] - e.box[1]) >= 6]
    rng.shuffle(els)
    out = []
    for e in els:
        row = getattr(e, "row", None)
        if row is not None:  # a table row's control: its label repeats on every row, its row names it
            if not row_is_unique(e, sample.elements, sample.texts):
                continue
            try:
                point = click_point(e.box, w, h, rng)
            except ValueError:
                continue
            out.append((row_instruction(e.label, e.role, row, rng), answer_text(point)) + ((e.box,) if boxes else ()))
            if len(out) == k:
                break
            continue
        pat = _word(e.label)
        if any(o is not e and pat.search(o.label.lower()) for o in sample.elements):
            continue
        reach = 2 * (e.box[3] - e.box[1]) + 24  # px around the element where its own caption may sit
        near = (e.box[0] - reach, e.box[1] - reach, e.box[2] + reach, e.box[3] + reach)
        if any(pat.search(t.text.lower()) and not (t.box[0] < near[2] and near[0] < t.box[2] and t.box[1] < near[3]
                                                 and near[1] < t.box[3]) for t in sample.texts):
            continue
        try:
            point = click_point(e.box, w, h, rng)
        except ValueError:
            continue
        out.append((instruction_for(e.label, e.role, rng), answer_text(point)) + ((e.box,) if boxes else ()))
        if len(out) == k:
            break
    return out

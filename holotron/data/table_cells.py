"""The texts of a table's cells (tables.py): identifiers made up here, open-vocabulary strings no label list holds
(file names with extensions, codes such as "INV-20417" or "QT/0093", people's names of made-up syllables), and
dates, amounts, sizes, e-mail addresses and counts; and the rule that keeps the held-out vocabulary out of them
(``contains_avoided``: no entry of vocab.heldout_vocab() as whole words). ``fresh`` draws one such text unused on
the screen, ``fixed`` claims fixed texts (column names, statuses, actions) through the screen's label picker.
"""

from __future__ import annotations

import functools
import re

from .context import Ctx

# made-up words: syllables, and common words of file names
_ONSETS = ("b", "br", "c", "ch", "d", "dr", "f", "fl", "g", "gr", "h", "j", "k", "kr", "l", "m", "n", "p", "pr", "r",
           "s", "sh", "st", "t", "tr", "v", "w", "z", "th", "bl", "q", "y")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ea", "io", "ou", "y")
_CODAS = ("", "", "", "", "n", "r", "l", "s", "th", "m", "k", "x", "nd", "rt", "sk")
_FILE_WORDS = ("report", "invoice", "notes", "draft", "budget", "photo", "scan", "backup", "summary", "plan",
               "contract", "slides", "data", "logo", "final", "minutes", "agenda", "roadmap", "receipt", "statement",
               "resume", "brief", "sketch", "mockup", "audit", "payroll", "inventory", "manual", "q1", "q2", "q3",
               "q4", "spec", "export", "lease", "quote", "memo", "deck", "chart", "survey")
_EXTENSIONS = ("pdf", "docx", "xlsx", "csv", "png", "jpg", "zip", "txt", "pptx", "json", "mp4", "svg", "md", "odt",
               "tar.gz", "mov", "xml", "key")
_PREFIXES = ("INV", "PO", "ORD", "TCK", "REQ", "SO", "CASE", "PR", "INC", "BUG", "EXP", "QT", "RMA", "SHP", "ACC",
             "CN", "JOB", "LOT")
_DOMAINS = ("example.com", "example.org", "mail.example", "corp.example", "team.example", "example.net")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@functools.lru_cache(maxsize=4)
def _avoid_rule(avoid: frozenset[str]):
    """(single words, a pattern for the entries of several words) of a set of lower-cased entries."""
    single = frozenset(a for a in avoid if re.fullmatch(r"[a-z0-9]+", a))
    multi = [re.escape(a) for a in sorted(avoid - single)]
    pattern = re.compile(r"(?<![a-z0-9])(?:" + "|".join(multi) + r")(?![a-z0-9])") if multi else None
    return single, pattern


def contains_avoided(text: str, avoid: frozenset[str]) -> bool:
    """True when an entry of ``avoid`` (lower-cased) occurs in ``text`` as whole words, case-insensitively:
    equal to it, or a word or run of words of it ("ok" in "OK-2041", "save" in "save_notes.pdf")."""
    if not avoid:
        return False
    low = text.lower()
    single, pattern = _avoid_rule(avoid)
    return bool(single & set(re.findall(r"[a-z0-9]+", low))) or bool(pattern and pattern.search(low))


def _syllable_word(x: Ctx, syllables: int) -> str:
    w = "".join(x.rng.choice(_ONSETS) + x.rng.choice(_VOWELS) for _ in range(syllables))
    return w + x.rng.choice(_CODAS)


def _made_up(x: Ctx, kind: str) -> str:
    """One made-up cell text of ``kind`` (file, code, person, date, amount, size, email, owner, count)."""
    r = x.rng
    if kind == "file":
        parts = [r.choice(_FILE_WORDS) if r.random() < 0.55 else _syllable_word(x, r.randint(1, 2))
                 for _ in range(r.randint(1, 3))]
        if r.random() < 0.4:
            parts.append(r.choice((f"v{r.randint(1, 9)}", str(r.randint(2015, 2026)), f"{r.randint(1, 99):02d}",
                                   "final", "old", "copy")))
        stem = r.choice(("_", "-", "_", " ")).join(parts)
        stem = stem.title() if r.random() < 0.3 else stem
        return f"{stem}.{r.choice(_EXTENSIONS)}"
    if kind == "code":
        prefix = r.choice(_PREFIXES) if r.random() < 0.6 else "".join(chr(65 + r.randrange(26))
                                                                        for _ in range(r.randint(2, 4)))
        digits = r.randint(3, 6)
        code = f"{prefix}{r.choice(('-', '-', '-', '#', '/'))}{r.randrange(10 ** digits):0{digits}d}"
        return code + (f"-{chr(65 + r.randrange(26))}{r.choice(('', str(r.randint(1, 9))))}" if r.random() < 0.15
                       else "")
    if kind in ("person", "owner"):
        first = _syllable_word(x, r.randint(1, 2)).capitalize()
        last = _syllable_word(x, r.randint(2, 3)).capitalize()
        return f"{first[0]}. {last}" if r.random() < 0.15 else f"{first} {last}"
    if kind == "date":
        y, m, d = r.randint(2019, 2026), r.randint(1, 12), r.randint(1, 28)
        return r.choice((f"{y}-{m:02d}-{d:02d}", f"{_MONTHS[m - 1]} {d}, {y}", f"{d:02d}/{m:02d}/{y}",
                         f"{d} {_MONTHS[m - 1]} {y}", f"{m}/{d}/{y % 100:02d}"))
    if kind == "amount":
        v = r.choice((r.randint(1, 99) + r.randrange(100) / 100, r.randint(100, 9999) + r.randrange(100) / 100,
                      float(r.randint(10, 90000))))
        sym = r.choice(("$", "$", "€", "£", "CHF "))
        return f"{sym}{v:,.2f}" if r.random() < 0.8 else f"{v:,.2f} {sym.strip()}"
    if kind == "size":
        return r.choice((f"{r.randint(1, 999)} KB", f"{r.uniform(1, 900):.1f} MB", f"{r.uniform(1, 9):.2f} GB"))
    if kind == "email":
        name = _syllable_word(x, r.randint(1, 2)) + r.choice((".", "_", "")) + _syllable_word(x, 2)
        return f"{name}@{r.choice(_DOMAINS)}"
    if kind == "count":
        return str(r.choice((r.randint(0, 9), r.randint(10, 99), r.randint(100, 999), r.randint(1000, 99999))))
    raise ValueError(f"unknown cell kind {kind!r}")  # pragma: no cover


def fresh(x: Ctx, kind: str) -> str | None:
    """A made-up text of ``kind`` that no other text of the screen uses and that holds no avoided word."""
    for _ in range(30):
        s = _made_up(x, kind)
        if not contains_avoided(s, x.avoid) and x.labels.claim(s):
            return s
    return None


def fixed(x: Ctx, options, n: int = 1) -> list[str]:
    """Up to ``n`` texts of ``options`` (in a random order) claimed for this table: unused on the screen, no
    held-out word, and no held-out label on a vocab="train" screen (the label picker refuses them)."""
    out = []
    for s in x.rng.sample(list(options), len(options)):
        if len(out) == n:
            break
        if not contains_avoided(s, x.avoid) and x.labels.claim(s):
            out.append(s)
    return out

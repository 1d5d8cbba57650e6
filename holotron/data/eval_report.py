"""What an evaluation (``holotron.eval``) writes: a ``Prediction`` per example and the ``Report`` that counts
them, point-in-box accuracy with its Wilson 95% interval (``wilson_interval``), per role and, for synthetic
screens, per screen-size family and per vocabulary (the target's label held out of training or not).
``holotron.eval`` re-exports all of them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..grounding import Box, Point

Z95 = 1.959963984540054  # the normal quantile of 0.975


def wilson_interval(hits: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion hits / n (95% with the default z); (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= hits <= n:
        raise ValueError(f"hits must be in [0, n={n}], got {hits}")
    p = hits / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    lo = 0.0 if hits == 0 else max(0.0, centre - half)  # exact at the edges (rounding would leave 1 - 1e-16)
    hi = 1.0 if hits == n else min(1.0, centre + half)
    return lo, hi


@dataclass
class Prediction:
    id: str
    role: str
    instruction: str
    answer: str
    point: Point | None
    hit: bool
    box: Box
    size: tuple[int, int]
    family: str | None = None
    vocab: str | None = None

    def to_json(self) -> dict:
        return {"id": self.id, "role": self.role, "instruction": self.instruction, "answer": self.answer,
                "click": None if self.point is None else [self.point.x, self.point.y], "hit": self.hit,
                "box": [self.box.x0, self.box.y0, self.box.x1, self.box.y1], "box_space": self.box.space,
                "image_size": list(self.size),
                **({"family": self.family} if self.family is not None else {}),
                **({"vocab": self.vocab} if self.vocab is not None else {})}


def _breakdown(counts: dict[str, list[int]]) -> dict[str, dict]:
    """{key: {n, hits, accuracy, ci95}} from {key: [hits, n]}, keys sorted."""
    out = {}
    for key in sorted(counts):
        h, n = counts[key]
        lo, hi = wilson_interval(h, n)
        out[key] = {"n": n, "hits": h, "accuracy": h / n, "ci95": [lo, hi]}
    return out


@dataclass
class Report:
    n: int = 0
    hits: int = 0
    unparseable: int = 0
    seconds: float = 0.0
    roles: dict[str, list[int]] = field(default_factory=dict)  # role -> [hits, n]
    families: dict[str, list[int]] = field(default_factory=dict)  # size family -> [hits, n] (synthetic screens)
    vocabs: dict[str, list[int]] = field(default_factory=dict)  # "heldout" / "train" -> [hits, n] (synthetic)
    predictions: list[Prediction] = field(default_factory=list, repr=False)

    @property
    def accuracy(self) -> float:
        return self.hits / self.n if self.n else 0.0

    @property
    def ci(self) -> tuple[float, float]:
        return wilson_interval(self.hits, self.n)

    def add(self, p: Prediction) -> None:
        self.n += 1
        self.hits += p.hit
        self.unparseable += p.point is None
        for counts, key in ((self.roles, p.role), (self.families, p.family), (self.vocabs, p.vocab)):
            if key is not None:  # ScreenSpot examples have no family or vocab
                c = counts.setdefault(key, [0, 0])
                c[0] += p.hit
                c[1] += 1
        self.predictions.append(p)

    def per_role(self) -> dict[str, dict]:
        return _breakdown(self.roles)

    def per_family(self) -> dict[str, dict]:
        """Per screen-size family (holotron.data.SIZES; "custom" for sizes given in pixels)."""
        return _breakdown(self.families)

    def per_vocab(self) -> dict[str, dict]:
        """"heldout": the target's label is in holotron.data.heldout_vocab(); "train": it is not."""
        return _breakdown(self.vocabs)

    def to_json(self) -> dict:
        lo, hi = self.ci
        out = {"n": self.n, "hits": self.hits, "accuracy": self.accuracy, "ci95": [lo, hi],
               "unparseable": self.unparseable, "seconds": round(self.seconds, 2), "per_role": self.per_role()}
        if self.families:
            out["per_family"] = self.per_family()
        if self.vocabs:
            out["per_vocab"] = self.per_vocab()
        return out

    def table(self) -> str:
        lo, hi = self.ci
        lines = [f"point-in-box accuracy: {self.hits}/{self.n} = {100 * self.accuracy:.1f}% "
                 f"(95% Wilson CI {100 * lo:.1f}-{100 * hi:.1f}); unparseable answers: {self.unparseable}"]
        for what, per in (("role", self.per_role()), ("size family", self.per_family()), ("vocab", self.per_vocab())):
            if not per:
                continue
            lines.append(f"{what:<16} {'n':>6} {'hits':>6} {'acc %':>7}  95% CI")
            for key, r in per.items():
                lines.append(f"{key:<16} {r['n']:>6} {r['hits']:>6} {100 * r['accuracy']:>7.1f}  "
                             f"{100 * r['ci95'][0]:.1f}-{100 * r['ci95'][1]:.1f}")
        return "\n".join(lines)

"""The training-only heads on the image tokens (``AuxHeads``): written beside a checkpoint as aux_heads.pt,
never part of the model ``holotron.load`` reads."""

from __future__ import annotations

import torch
from torch import nn

from ..model import HolotronConfig
from .matching import MatchHeads
from .targets import AUX_CLASSES, N_CHAR

__all__ = ["AuxHeads", "POINTER_DIM"]

POINTER_DIM = 64  # width of the pointer head's queries and keys


class AuxHeads(nn.Module):
    """Training-only heads on the image tokens: the text class from the projector's output (what the
    vision tower reads), the character under each of its patches, and, from the residual stream entering
    the last attention layer, the text class and the screen position (what the lookup "which image token
    carries this label, and where is it" needs), and a pointer: a query from the position that answers a
    question, keys from the image tokens, scored against the tokens on the question's element (the lookup
    itself, which the last attention layer has to learn). Not saved with the model."""

    def __init__(self, config: HolotronConfig, n_classes: int = AUX_CLASSES):
        super().__init__()
        d = config.text.hidden_size
        kinds = config.text.layer_kinds
        attn = [i for i, k in enumerate(kinds) if k == "attention"]
        self.layer = max(0, (attn[-1] if attn else len(kinds)) - 1)
        self.label_in = nn.Linear(d, n_classes)
        self.label_mid = nn.Linear(d, n_classes)
        self.pos_mid = nn.Linear(d, 2)
        self.merge = config.vision.merge
        self.char_in = nn.Linear(d, self.merge**2 * N_CHAR)  # the character under each of a token's patches
        self.ptr_q = nn.Linear(d, POINTER_DIM)
        self.ptr_k = nn.Linear(d, POINTER_DIM)
        self.centre_mid = nn.Linear(d, 3)  # the element centre (f cx, f cy, f) each token carries (matching.py)
        self.match = MatchHeads(d)  # the matching losses (holotron/train/matching.py)

    def chars(self, emb: torch.Tensor) -> torch.Tensor:
        """Projector outputs (n, d) -> character logits (n * merge^2, N_CHAR), fp32."""
        return self.char_in(emb.to(self.char_in.weight.dtype)).float().reshape(-1, N_CHAR)

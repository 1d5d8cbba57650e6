"""How queued requests enter the decode engine's rows (``holotron/engine.py``): prompts embedded (images
merged for a VL model), prefilled through ``HybridLM.forward`` in chunks of about ``prefill_tokens``
tokens, a group of requests together and left-padded, after a shared prefix's state when they have one;
the result copied into free rows of the ``DecodeState``, pads dropped, and each row's first token chosen.

``Admission`` is a base class of ``Engine``, written against its attributes (``model``, ``lm``, ``device``,
``state``, ``rows``, ``lens``, ``queue``, ``tokens``, the sampling tensors, ``_emit``).
"""

from __future__ import annotations

import torch

from .engine_requests import Prefix, Request
from .sampling import choose_tokens
from .state import KVCache, MambaState

__all__ = ["Admission"]


class Admission:
    """``Engine._embeds``, ``_prefill`` and ``_admit``."""

    def _embeds(self, req: Request) -> torch.Tensor:
        """(T, D) prompt embeddings (images merged for a VL model)."""
        if req.inputs_embeds is not None:
            return req.inputs_embeds.to(self.device)
        ids = req.input_ids.to(self.device)
        if hasattr(self.model, "embed_inputs"):
            return self.model.embed_inputs(ids[None], **req.image_kw)[0]
        return self.lm.backbone.embeddings(ids)

    def _prefill(self, x: torch.Tensor, mask: torch.Tensor, prefix: Prefix | None):
        """Prefill (n, T, D) left-padded embeddings (mask (n, T) False at pads), after ``prefix`` when
        given, in chunks of about ``prefill_tokens`` tokens. Returns the InferenceState and last logits (n, V)."""
        n, T, _ = x.shape
        P = prefix.length if prefix is not None else 0
        tmp = self.lm.new_state(n, capacity=P + T)
        if prefix is not None:
            for d, s in zip(tmp.layers, prefix.state.layers):
                if isinstance(d, MambaState):
                    d.conv.copy_(s.conv.expand_as(d.conv))
                    d.ssm.copy_(s.ssm.expand_as(d.ssm))
                elif isinstance(d, KVCache):
                    d.k[:, :, :P].copy_(s.k[:, :, :P].expand(n, -1, -1, -1))
                    d.v[:, :, :P].copy_(s.v[:, :, :P].expand(n, -1, -1, -1))
            tmp.seqlen = P
            mask = torch.cat([torch.ones(n, P, dtype=torch.bool, device=mask.device), mask], 1)
        cs = self.lm.config.chunk_size
        chunk = max(cs, (self.prefill_tokens // n) // cs * cs)
        for c0 in range(0, T, chunk):
            c1 = min(T, c0 + chunk)
            logits = self.lm(inputs_embeds=x[:, c0:c1], state=tmp, attention_mask=mask[:, :P + c1], logits_to_keep=1)
        return tmp, logits[:, -1]

    def _admit(self) -> list[tuple[Request, int]]:
        free = [i for i, q in enumerate(self.rows) if q is None]
        take: list[Request] = []
        while self.queue and len(take) < len(free):
            take.append(self.queue.popleft())
        if not take:
            return []
        groups: dict[tuple, list[tuple[Request, int]]] = {}  # same prefix (and suffix or not): one prefill
        for req, row in zip(take, free):
            groups.setdefault((id(req.prefix), req.suffix_len == 0), []).append((req, row))
        out = []
        for (_, empty), members in groups.items():
            reqs, rows = [m[0] for m in members], [m[1] for m in members]
            pre = reqs[0].prefix
            if empty:  # the prefix alone: copy its state, its logits give the first token
                src, logits, idx = pre.state, pre.logits[None].expand(len(reqs), -1), [0] * len(reqs)
            else:
                embeds = [self._embeds(r) for r in reqs]
                T = max(e.shape[0] for e in embeds)
                x = embeds[0].new_zeros(len(reqs), T, embeds[0].shape[-1])
                mask = torch.zeros(len(reqs), T, dtype=torch.bool, device=x.device)
                for i, e in enumerate(embeds):
                    x[i, T - e.shape[0]:] = e
                    mask[i, T - e.shape[0]:] = True
                src, logits = self._prefill(x, mask, pre)
                idx = list(range(len(reqs)))
            for req, row, i in zip(reqs, rows, idx):
                self.lens[row] = self.state.load(row, src, i)
                self.rows[row], req.row = req, row
                self.temperature[row] = req.temperature
                self.top_k[row] = req.top_k if req.top_k is not None else self.vocab
                self.top_p[row] = req.top_p if req.top_p is not None else 2.0
                self.active[row] = 1
            rows_t = torch.tensor(rows, device=self.device)
            if self.sampling:
                first = choose_tokens(logits.float(), self.temperature[rows_t], self.top_k[rows_t], self.top_p[rows_t],
                                      self.generator)
            else:
                first = logits.argmax(-1)
            self.tokens[rows_t] = first
            for req, tok in zip(reqs, first.tolist()):
                out.append((req, tok))
                self._emit(req, tok)
        return out

"""How ``generate()`` streams a batch of prompts through the decode engine (``holotron/engine.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["stream"]


def stream(eng, input_ids: torch.Tensor, max_new_tokens: int, *, attention_mask: torch.Tensor | None = None,
           temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
           eos_token_id=(), pad_token_id: int = 0, **prefill_kwargs) -> Iterator[torch.Tensor]:
    """``generate.stream`` on ``eng``: (B,) new tokens per step, ``pad_token_id`` for finished
    rows, ending early when every row has finished. The engine must be idle; the prompts are
    admitted together and prefilled in shared chunks."""
    if not eng.idle:
        raise RuntimeError("Engine.stream: the engine is serving other requests")
    b, t = input_ids.shape
    if b > eng.max_batch:
        raise ValueError(f"Engine.stream: batch {b} exceeds max_batch {eng.max_batch}")
    with torch.inference_mode():
        if hasattr(eng.model, "embed_inputs"):
            x = eng.model.embed_inputs(input_ids, **prefill_kwargs)
        elif prefill_kwargs:
            raise ValueError(f"{type(eng.model).__name__} takes no {sorted(prefill_kwargs)}")
        else:
            x = eng.lm.backbone.embeddings(input_ids)
    mask = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    reqs = [eng.submit(inputs_embeds=x[i][mask[i]], max_new_tokens=max_new_tokens, temperature=temperature,
                        top_k=top_k, top_p=top_p, eos_token_id=eos_token_id, tag=i) for i in range(b)]
    k = 0  # the k-th new token of every row is yielded once each row has it or has finished
    try:
        while k < max_new_tokens and not all(r.done and len(r.tokens) <= k for r in reqs):
            while not all(r.done or len(r.tokens) > k for r in reqs):
                eng.step()
                eng._check_progress()
            out = [r.tokens[k] if len(r.tokens) > k else pad_token_id for r in reqs]
            yield torch.tensor(out, dtype=torch.long, device=input_ids.device)
            k += 1
    finally:
        for r in reqs:
            if not r.done:
                eng.cancel(r)

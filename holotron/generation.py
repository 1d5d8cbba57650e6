"""Generation: prefill once, then one token at a time with a constant-size Mamba state.

    new = generate(model, input_ids, max_new_tokens=64)                   # greedy
    new = generate(model, ids, 64, temperature=0.7, top_p=0.9, seed=0)    # sampling
    for step in stream(model, ids, 64): ...                               # (batch,) per step
    generate(model, ids, 64, streamer=lambda tok: print(tok.tolist()))    # callback per step

``model`` is anything with ``new_state(batch, capacity)`` and
``model(input_ids, state=, attention_mask=, logits_to_keep=1, **prefill_kwargs) -> logits`` (a
``HybridLM``, or the VL model with ``pixel_values`` passed through ``prefill_kwargs``).
Prompts of different lengths are left-padded with an ``attention_mask`` (0 at pads); a row that
emits an end-of-sequence id stops (its later positions hold ``pad_token_id``) and is dropped from
the state, so the others decode as if alone.

On CUDA the decode runs on ``holotron.engine`` (static state, one CUDA graph per step, finished rows
dropped from the work); its greedy tokens are the plain loop's. ``engine=False`` (or the environment
variable HOLOTRON_ENGINE=0) keeps the plain loop; ``engine=True`` uses the engine on any device
(eagerly off CUDA); an ``Engine`` instance is used as given. ``holotron.engine.release(model)`` frees
the state the engine keeps between calls.

A long prompt can be prefilled in pieces (``prefill_chunk``, plain loop only), each piece continuing
the state of the one before, with ``on_prefill(done, total)`` called after each: the command line uses
it to show progress on the CPU. ``python -m holotron.generate`` is the command line
(``holotron/generate.py``, which also re-exports these functions).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from .sampling import sample

__all__ = ["generate", "generate_text", "stream", "sample", "eos_ids", "stop_ids"]


def eos_ids(model) -> tuple[int, ...]:
    """End-of-sequence ids of a model: config ``eos_token_id`` plus generation_config.json's (int or list)."""
    ids: list[int] = []
    cfg = getattr(model, "config", None)
    cfg = getattr(cfg, "text", cfg)  # a VL config carries the LM's under .text
    for v in (getattr(cfg, "eos_token_id", None),
              (getattr(model, "generation_config", None) or {}).get("eos_token_id")):
        for i in ([] if v is None else [v] if isinstance(v, int) else list(v)):
            if i not in ids:
                ids.append(int(i))
    return tuple(ids)


def _check(input_ids, max_new_tokens, temperature, top_k, top_p, attention_mask):
    if (not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2
            or input_ids.dtype not in (torch.int64, torch.int32)):
        raise ValueError(f"input_ids must be an integer tensor (batch, seqlen), got "
                         f"{getattr(input_ids, 'shape', type(input_ids))} {getattr(input_ids, 'dtype', '')}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is empty: generation needs at least one prompt token")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if temperature == 0 and (top_k is not None or top_p is not None):
        raise ValueError("top_k / top_p only apply when sampling: pass temperature > 0")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if attention_mask is not None:
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
                             f"got {tuple(attention_mask.shape)}")
        if not bool(attention_mask.bool()[:, -1].all()):
            raise ValueError("attention_mask: the last prompt position of every row must be a real token "
                             "(pad on the left for generation)")


def stream(model, input_ids: torch.Tensor, max_new_tokens: int = 32, *, attention_mask: torch.Tensor | None = None,
           temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
           generator: torch.Generator | None = None, seed: int | None = None,
           eos_token_id: int | list[int] | None = None, pad_token_id: int | None = None,
           engine=None, prefill_chunk: int | None = None, on_prefill: Callable[[int, int], None] | None = None,
           ssm_dtype: torch.dtype = torch.float32, constrain: Callable | None = None,
           **prefill_kwargs) -> Iterator[torch.Tensor]:
    """Yield the new token of every row, (B,) per step; finished rows yield ``pad_token_id``.

    ``eos_token_id``: stop ids (default: the model's, see ``eos_ids``; ``[]`` never stops early).
    ``seed`` makes a fresh generator on the model's device when ``generator`` is not given (on the
    engine path, ``seed`` / ``generator`` seed the engine's own generator: the draws differ from the
    plain loop's, greedy tokens do not). ``engine``: None (the engine on CUDA), False, True, or an Engine.
    ``prefill_chunk``: prefill a longer prompt in pieces of this many tokens (the plain loop; a model with
    images needs ``embed_inputs``); ``on_prefill(done, total)`` is called after each piece.
    ``ssm_dtype``: the Mamba state's dtype during decode (float32; float16 / bfloat16 halve its bytes,
    ``dev/probes/state_drift.py`` measures what they change). ``constrain(logits, state, rows) -> logits``:
    applied to each step's logits (rows: the original row of each row still in ``state``) before the token is
    chosen, on the plain loop (given one, the engine is not used): ``click_pointer.PointerConstraint``.
    """
    _check(input_ids, max_new_tokens, temperature, top_k, top_p, attention_mask)
    if prefill_chunk is not None and (not isinstance(prefill_chunk, int) or prefill_chunk < 1):
        raise ValueError(f"prefill_chunk must be an int >= 1, got {prefill_chunk!r}")
    b, t = input_ids.shape
    eos = (eos_ids(model) if eos_token_id is None
           else (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id))
    if pad_token_id is None:
        cfg = getattr(model, "config", None)
        pad_token_id = getattr(getattr(cfg, "text", cfg), "pad_token_id", None)
        pad_token_id = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
    if generator is None and seed is not None:
        generator = torch.Generator(device=input_ids.device).manual_seed(seed)
    if max_new_tokens == 0:
        return
    eng = None if constrain is not None else _engine(model, engine, b, t + max_new_tokens, temperature > 0,
                                                     prefill_kwargs, ssm_dtype)
    if eng is not None:
        if eng.sampling:  # the engine's generator, seeded reproducibly from seed / generator / the global RNG
            if seed is None:
                dev = generator.device if generator is not None else "cpu"
                seed = int(torch.randint(2**62, (1,), generator=generator, device=dev))
            eng.generator.manual_seed(seed)
        yield from eng.stream(input_ids, max_new_tokens, attention_mask=attention_mask, temperature=temperature,
                              top_k=top_k, top_p=top_p, eos_token_id=eos, pad_token_id=pad_token_id, **prefill_kwargs)
        return
    eos_t = torch.tensor(eos, dtype=torch.long, device=input_ids.device)

    with torch.inference_mode():
        state = model.new_state(b, capacity=t + max_new_tokens, ssm_dtype=ssm_dtype)
        logits = _prefill(model, input_ids, state, attention_mask, prefill_chunk, on_prefill, prefill_kwargs)
        rows = torch.arange(b, device=input_ids.device)  # which original rows are still in the state
        for step in range(max_new_tokens):
            if constrain is not None:
                logits = constrain(logits, state, rows)
            tok = sample(logits, temperature, top_k, top_p, generator)          # (rows,)
            out = torch.full((b,), pad_token_id, dtype=torch.long, device=input_ids.device)
            out[rows] = tok
            yield out
            if step == max_new_tokens - 1:
                return
            alive = ~torch.isin(tok, eos_t)
            if not bool(alive.all()):
                if not bool(alive.any()):
                    return
                keep = alive.nonzero().squeeze(1)
                state.select(keep)
                rows, tok = rows[keep], tok[keep]
            logits = model(tok[:, None], state=state, logits_to_keep=1)[:, -1]


def _prefill(model, input_ids, state, attention_mask, chunk, on_prefill, prefill_kwargs) -> torch.Tensor:
    """Last-position logits (B, V) of the prompt, run into ``state`` in one call or in pieces of ``chunk``."""
    t = input_ids.shape[1]
    if chunk is None or t <= chunk:
        logits = model(input_ids, state=state, attention_mask=attention_mask, logits_to_keep=1, **prefill_kwargs)
        if on_prefill is not None:
            on_prefill(t, t)
        return logits[:, -1]
    if prefill_kwargs:  # images are embedded once; the pieces then go in as embeddings
        if not hasattr(model, "embed_inputs"):
            raise ValueError(f"prefill_chunk with {sorted(prefill_kwargs)} needs a model with embed_inputs")
        embeds = model.embed_inputs(input_ids, **prefill_kwargs)
        piece = lambda a, z: {"inputs_embeds": embeds[:, a:z]}  # noqa: E731
    else:
        piece = lambda a, z: {"input_ids": input_ids[:, a:z]}  # noqa: E731
    for a in range(0, t, chunk):
        z = min(t, a + chunk)
        mask = None if attention_mask is None else attention_mask[:, :z]  # the mask so far (past + this piece)
        logits = model(**piece(a, z), state=state, attention_mask=mask, logits_to_keep=1)
        if on_prefill is not None:
            on_prefill(z, t)
    return logits[:, -1]


def _engine(model, engine, batch: int, max_len: int, sampling: bool, prefill_kwargs: dict, ssm_dtype):
    """The Engine to decode on, or None for the plain loop (see the module docstring)."""
    from . import engine as engine_mod

    if engine is False:
        return None
    if isinstance(engine, engine_mod.Engine):
        return engine
    if engine is None:
        dev = getattr(model, "device", None)
        if not engine_mod.enabled() or dev is None or torch.device(dev).type != "cuda":
            return None
    if not set(prefill_kwargs) <= {"pixel_values", "num_tiles", "image_embeds"}:
        if engine:
            raise ValueError(f"engine=True: the engine does not take {sorted(prefill_kwargs)}")
        return None
    try:
        return engine_mod.engine_for(model, batch, max_len, sampling=sampling, ssm_dtype=ssm_dtype)
    except engine_mod.EngineUnsupported as e:
        if engine:
            raise
        engine_mod.log.info("holotron.generate: the plain decode loop: %s", e)
        return None


def generate(model, input_ids: torch.Tensor, max_new_tokens: int = 32, *,
             streamer: Callable[[torch.Tensor], None] | None = None, **kwargs) -> torch.Tensor:
    """The new tokens (B, n) with n <= max_new_tokens (fewer when every row stopped on an eos id).

    Greedy unless ``temperature`` > 0; all keyword arguments are those of ``stream``. ``streamer``
    is called with each step's (B,) tokens as they are produced. A 1-d prompt gives a 1-d result.
    """
    one = isinstance(input_ids, torch.Tensor) and input_ids.dim() == 1
    if one:
        input_ids = input_ids[None]
        if kwargs.get("attention_mask") is not None:
            kwargs["attention_mask"] = kwargs["attention_mask"].reshape(1, -1)
    steps = []
    for tok in stream(model, input_ids, max_new_tokens, **kwargs):
        steps.append(tok)
        if streamer is not None:
            streamer(tok)
    out = torch.stack(steps, dim=1) if steps else input_ids.new_zeros(input_ids.shape[0], 0)
    return out[0] if one else out


def generate_text(model, processor, prompts, images=None, *, max_new_tokens: int | None = None,
                  stop: str | list[str] | tuple[str, ...] = (), skip_special_tokens: bool = True,
                  **kwargs) -> str | list[str]:
    """Prompts in, answers out: the processor builds the batch (chat template, image tiles, left
    padding), decoding follows the checkpoint's generation_config.json unless overridden by
    ``kwargs`` (those of ``stream``), every id of ``stop_ids(model, processor)`` ends a row, and a
    row's answer is cut before the first ``stop`` string it contains. One prompt (a text or a message
    list) gives a str; a list of prompts gives a list."""
    from .chat_messages import is_messages

    single = not (isinstance(prompts, (list, tuple)) and not is_messages(prompts))
    stops = [stop] if isinstance(stop, str) else list(stop)
    batch = processor(prompts, images=images).to(model.device, model.dtype)
    gen = processor.generation_config.generate_kwargs()
    gen.pop("eos_token_id", None)
    gen.update(kwargs)
    max_new = max_new_tokens if max_new_tokens is not None else gen.pop("max_new_tokens", None) or 256
    gen.pop("max_new_tokens", None)
    eos = set(kwargs.pop("eos_token_id", None) or stop_ids(model, processor))
    gen["eos_token_id"] = sorted(eos)
    gen.setdefault("pad_token_id", processor.pad_token_id)
    image_kw = {k: batch[k] for k in ("pixel_values", "num_tiles") if k in batch}

    n = batch["input_ids"].shape[0]
    decoders = [processor.stream_decoder(skip_special_tokens) for _ in range(n)]
    texts, done = [""] * n, [False] * n
    it = stream(model, batch["input_ids"], max_new, attention_mask=batch["attention_mask"], **image_kw, **gen)
    for tok in it:
        for r, t in enumerate(tok.tolist()):
            if done[r]:
                continue
            if t in eos:
                done[r] = True
                continue
            texts[r] += decoders[r].put(t)
            hits = [texts[r].index(s) for s in stops if s in texts[r]]
            if hits:
                texts[r], done[r] = texts[r][:min(hits)], True
        if all(done):
            it.close()
            break
    for r in range(n):
        if not done[r]:
            texts[r] += decoders[r].flush()
            hits = [texts[r].index(s) for s in stops if s in texts[r]]
            if hits:
                texts[r] = texts[r][:min(hits)]
    return texts[0] if single else texts


def stop_ids(model, processor=None) -> tuple[int, ...]:
    """Every id that ends an answer: the model's (config + generation_config.json) and, with a
    ``Processor``, the tokenizer's eos and the chat format's end-of-turn token."""
    ids = list(eos_ids(model))
    if processor is not None:
        ids += list(processor.stop_token_ids)
    return tuple(dict.fromkeys(ids))


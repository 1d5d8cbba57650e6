"""HybridLM: the Nemotron-H language model (docs/architecture.md, section 2).

    backbone.embeddings                    Embedding(V, D)
    backbone.layers[i] = Block(kind)       x = x + mixer(norm(x)); kind from the pattern: 'M' Mamba2,
                                           '*' attention, '-' relu^2 MLP
    backbone.norm_f                        RMSNorm(D)
    lm_head                                Linear(D, V), untied

Module and parameter names are the checkpoint's. ``model(input_ids)`` returns fp32 logits; pass an
``InferenceState`` from ``model.new_state(batch)`` to prefill (in one call or several) and decode.
``model.step(tokens, state)`` decodes one token per row of a static ``DecodeState`` (fixed shapes, no
host sync): the step the decode engine captures in a CUDA graph (``holotron/engine.py``). Every mixer
has the same two entry points, ``forward(u, state, where)`` and the one-token ``step(u, state, where)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .attention import Attention, causal_mask
from .config import TextConfig
from .decode_ops import norm_linear
from .layers import MLP, RMSNorm
from .mamba2 import Mamba2Mixer
from .state import DecodeState, InferenceState, Positions, device_ints

__all__ = ["HybridLM", "Block"]


class Block(nn.Module):
    """Pre-norm residual block around one mixer."""

    def __init__(self, cfg: TextConfig, kind: str):
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)
        if kind == "mamba":
            self.mixer = Mamba2Mixer(cfg.hidden_size, cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.ssm_state_size,
                                     cfg.n_groups, cfg.conv_kernel, cfg.use_conv_bias, cfg.chunk_size,
                                     cfg.layer_norm_epsilon, cfg.time_step_limit)
        elif kind == "attention":
            self.mixer = Attention(cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        elif kind == "mlp":
            self.mixer = MLP(cfg.hidden_size, cfg.intermediate_size)
        else:
            raise ValueError(f"unknown layer kind {kind!r}")

    def forward(self, x, layer_state=None, where: Positions | None = None):
        # the residual keeps x's dtype (fp32 when residual_in_fp32)
        return x + self.mixer(self.norm(x.to(self.norm.weight.dtype)), layer_state, where)

    def mixed(self, x, layer_state, where: Positions, n: int):
        # x (N, D) flat: n decode tokens, then a chunk (HybridLM.mixed)
        return x + self.mixer.mixed(self.norm(x.to(self.norm.weight.dtype)), layer_state, where, n)

    def step(self, x, layer_state, where: Positions):
        # x + mixer(norm(x)): the mixer's one-token step takes the norm and the residual into its projections
        return self.mixer.step(x, layer_state, where, self.norm)


class Backbone(nn.Module):
    def __init__(self, cfg: TextConfig):
        super().__init__()
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, kind) for kind in cfg.layer_kinds)
        self.norm_f = RMSNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)


class HybridLM(nn.Module):
    # parameters kept in fp32 whatever the model dtype (per-head SSM constants; loading and .half() respect it)
    keep_fp32 = ("mixer.A_log", "mixer.D", "mixer.dt_bias")

    def __init__(self, config: TextConfig):
        super().__init__()
        self.config = config
        self.backbone = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.generation_config: dict = {}  # generation_config.json of a loaded checkpoint, when it has one

    # ------------------------------------------------------------------ state
    def layer_states(self, batch_size: int, capacity: int, ssm_dtype: torch.dtype = torch.float32,
                     zero: bool = True, kv_dtype: torch.dtype | None = None) -> list:
        """Each layer's own decode state (MambaState, KVCache of ``capacity`` slots, None for an MLP):
        the one allocator of ``new_state`` and ``DecodeState.allocate``. ``kv_dtype``: None (the weights'
        dtype) or torch.float8_e4m3fn (FP8 codes with per-slot scales, holotron/kv_cache.py)."""
        return [blk.mixer.new_state(batch_size, ssm_dtype, zero) if blk.kind == "mamba"
                else blk.mixer.new_state(batch_size, capacity, zero, kv_dtype) if blk.kind == "attention" else None
                for blk in self.backbone.layers]

    def new_state(self, batch_size: int, capacity: int = 0, ssm_dtype: torch.dtype = torch.float32,
                  kv_dtype: torch.dtype | None = None) -> InferenceState:
        """An empty inference state; ``capacity`` reserves KV slots up front (it grows when exceeded).
        ``ssm_dtype``: the Mamba state's dtype (float32; float16 / bfloat16 halve its bytes). ``kv_dtype``: the
        KV caches' (None: the weights' dtype; torch.float8_e4m3fn: FP8, holotron/kv_cache.py)."""
        valid = torch.ones(batch_size, capacity, dtype=torch.bool, device=self.backbone.embeddings.weight.device)
        return InferenceState(self.layer_states(batch_size, capacity, ssm_dtype, kv_dtype=kv_dtype), valid)

    # ------------------------------------------------------------------ one decode step
    def step(self, tokens: torch.Tensor, state: DecodeState, active: torch.Tensor | None = None) -> torch.Tensor:
        """One token per row of ``state`` (a ``DecodeState``, or its ``rows(b)``): tokens (b,) -> fp32
        logits (b, V). Row r's token goes to KV slot ``state.lengths[r]`` (clamped to the last slot);
        the lengths then advance by ``active`` (b,) (default 1 each); rows where ``active`` is 0 write
        none of their state (their keys go to the spare slot ``max_len``, the Mamba kernels skip their
        stores; their logits are computed and meaningless). Static shapes, no host sync."""
        lengths = state.lengths.clamp(max=state.max_len - 1)
        write = lengths if active is None else torch.where(active != 0, lengths, state.max_len)  # spare slot
        where = Positions(lengths=write, n_keys=lengths + 1, active=active)
        x = self.backbone.embeddings(tokens[:, None])                           # (b, 1, D)
        if self.config.residual_in_fp32:
            x = x.float()
        for blk, st in zip(self.backbone.layers, state.layers):
            x = blk.step(x, st, where)
        state.lengths.add_(1 if active is None else active)
        return norm_linear(x[:, 0], self.backbone.norm_f, self.lm_head, out_dtype=torch.float32)

    # ------------------------------------------------------------------ prefill into decode rows
    def extend(self, inputs_embeds: torch.Tensor, state: DecodeState, rows: list[int], starts: list[int],
               counts: list[int], advance: bool = True) -> torch.Tensor:
        """Prefill new tokens into rows of a ``DecodeState`` (the decode engine's admissions and session
        turns): inputs_embeds (b, T, D) right-padded, row i's first ``counts[i]`` positions are new tokens
        of state row ``rows[i]``, whose length before the call is ``starts[i]`` (host ints: no sync). Pads
        after the tokens let the Mamba conv run on the rows as they are (no reordering). The rows' Mamba
        states, KV slots and lengths advance (``advance=False``: not ``state.lengths``, which the caller
        then sets); returns fp32 logits (b, V) at each row's last new token."""
        where, cnt = self._chunk_positions(inputs_embeds, state, rows, starts, counts)
        x = inputs_embeds.float() if self.config.residual_in_fp32 else inputs_embeds
        for blk, st in zip(self.backbone.layers, state.layers):
            x = blk(x, st, where)
        if advance:
            self._advance(state, where, cnt)
        b = x.shape[0]
        last = x[torch.arange(b, device=x.device), cnt - 1]  # (b, D): each row's last new token
        return self._logits(last)

    def extend_static(self, inputs_embeds: torch.Tensor, state: DecodeState, rows: torch.Tensor, starts: torch.Tensor,
                      counts: torch.Tensor) -> torch.Tensor:
        """``extend`` with the rows, their lengths and their counts as (b,) int64 device tensors and no check
        that reads them back: every shape depends on (b, T) alone and nothing waits for the GPU, so the decode
        engine captures it in a CUDA graph per (b, T) (``Engine(prefill_graphs=True)``). A row with count 0 is
        pads only and leaves its state row as it was (the engine warms up and captures with counts 0). The
        caller checks what ``extend`` checks. Returns fp32 logits (b, V) at each row's last new token;
        ``state.lengths`` advance."""
        b, t, _ = inputs_embeds.shape
        mask = torch.arange(t, device=inputs_embeds.device)[None, :] < counts[:, None]
        where = Positions(mask=mask, pads_after=True, static=True, row_index=rows, starts_t=starts, counts_t=counts)
        x = inputs_embeds.float() if self.config.residual_in_fp32 else inputs_embeds
        for blk, st in zip(self.backbone.layers, state.layers):
            x = blk(x, st, where)
        state.lengths.index_add_(0, rows, counts)
        last = x[torch.arange(b, device=x.device), (counts - 1).clamp(min=0)]
        return self._logits(last)

    def mixed(self, tokens: torch.Tensor, state: DecodeState, active: torch.Tensor, inputs_embeds: torch.Tensor,
              rows: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode token for each of the first n = len(tokens) rows of ``state`` (``step`` with ``active``) and
        a chunk of new tokens for other rows (``extend_static``'s arguments: rows, starts, counts (b,) int64 on
        the device, a count 0 is a row of pads only) in one pass: every linear layer reads its weights once for
        both (a chunk's matmuls are compute-bound, the decode tokens ride along), the token mixers run each part
        as ``step`` / ``extend_static`` do. Static shapes, no host sync: the decode engine captures it per
        (n, b, T) (``Engine(mixed=True)``). A chunk row may be one of the first n rows only where ``active`` is 0
        (that row's decode token then writes nothing). Returns fp32 logits (n, V) of the decode tokens and
        (b, V) at each chunk row's last new token; ``state.lengths`` advance."""
        n = tokens.shape[0]
        b, t, d = inputs_embeds.shape
        dev = inputs_embeds.device
        lengths = state.lengths[:n].clamp(max=state.max_len - 1)
        where = Positions(mask=torch.arange(t, device=dev)[None, :] < counts[:, None], pads_after=True, static=True,
                          row_index=rows, starts_t=starts, counts_t=counts,
                          lengths=torch.where(active != 0, lengths, state.max_len), n_keys=lengths + 1,
                          active=active)
        dt = torch.float32 if self.config.residual_in_fp32 else inputs_embeds.dtype
        x = torch.cat([self.backbone.embeddings(tokens).to(dt), inputs_embeds.reshape(b * t, d).to(dt)])
        for blk, st in zip(self.backbone.layers, state.layers):
            x = blk.mixed(x, st, where, n)
        state.lengths[:n].add_(active)
        state.lengths.index_add_(0, rows, counts)
        ends = n + torch.arange(b, device=dev) * t + (counts - 1).clamp(min=0)  # each chunk row's last new token
        logits = self._logits(torch.cat([x[:n], x[ends]]))
        return logits[:n], logits[n:]

    def _chunk_positions(self, inputs_embeds: torch.Tensor, state: DecodeState, rows: list[int],
                         starts: list[int], counts: list[int]) -> tuple[Positions, torch.Tensor]:
        b, t, d = inputs_embeds.shape
        if not (len(rows) == len(starts) == len(counts) == b):
            raise ValueError(f"extend: rows, starts and counts need one entry per batch row ({b})")
        if d != self.config.hidden_size or min(counts) < 1 or max(counts) > t:
            raise ValueError(f"extend: inputs_embeds (b, T, {self.config.hidden_size}) with 1 <= counts <= T, got "
                             f"{tuple(inputs_embeds.shape)} and counts {counts}")
        if max(s + n for s, n in zip(starts, counts)) > state.max_len:
            raise ValueError(f"extend: a row would exceed max_len {state.max_len}")
        dev = inputs_embeds.device
        both = device_ints(list(counts) + list(rows), dev)  # one copy, not waiting for the GPU
        cnt, idx = both[:b], both[b:]
        mask = None
        if min(counts) < t:
            mask = torch.arange(t, device=dev)[None, :] < cnt[:, None]
        return Positions(mask=mask, rows=list(rows), starts=list(starts), counts=list(counts), pads_after=True,
                         row_index=idx), cnt

    @staticmethod
    def _advance(state: DecodeState, where: Positions, cnt: torch.Tensor) -> None:
        state.lengths.index_add_(0, where.row_index.to(state.lengths.device), cnt.to(state.lengths.device))

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """fp32 logits of final hidden states h (m, D) (the residual stream before norm_f)."""
        h = self.backbone.norm_f(h.to(self.backbone.norm_f.weight.dtype))
        return self.lm_head(h.to(self.lm_head.weight.dtype)).float()

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor | None = None, *, inputs_embeds: torch.Tensor | None = None,
                state: InferenceState | None = None, attention_mask: torch.Tensor | None = None,
                logits_to_keep: int | None = None) -> torch.Tensor:
        """Logits (B, T, V) in fp32, or (B, logits_to_keep, V) for the last positions only.

        input_ids (B, T) or inputs_embeds (B, T, D). ``state`` (from ``new_state``) is read and updated
        in place, its position counter advanced by T. ``attention_mask`` (B, T) or (B, past + T), 1 for
        real tokens and 0 for padding: a padded position leaves the state as if it were absent.
        """
        h = self.hidden_states(input_ids, inputs_embeds=inputs_embeds, state=state, attention_mask=attention_mask)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        return self.lm_head(h.to(self.lm_head.weight.dtype)).float()

    def hidden_states(self, input_ids=None, *, inputs_embeds=None, state=None, attention_mask=None) -> torch.Tensor:
        """The backbone: final-normed hidden states (B, T, D)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        x = self.backbone.embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if x.dim() != 3 or x.shape[-1] != self.config.hidden_size:
            raise ValueError(f"inputs_embeds must be (batch, seqlen, {self.config.hidden_size}), got {tuple(x.shape)}")
        b, t, _ = x.shape
        if t == 0:
            raise ValueError("empty input: seqlen is 0")
        pos = 0 if state is None else state.seqlen
        if state is not None and state.batch_size != b:
            raise ValueError(f"state holds {state.batch_size} rows but the input has {b}")

        mask = None  # (B, T) bool, False at pads
        if attention_mask is not None:
            am = torch.as_tensor(attention_mask, device=x.device)
            if am.dim() != 2 or am.shape[0] != b or am.shape[1] not in (t, pos + t):
                raise ValueError(f"attention_mask must be (batch={b}, {t}) or (batch={b}, past + {t} = {pos + t}), "
                                 f"got {tuple(am.shape)}")
            mask = am[:, -t:].bool()
            if bool(mask.all()):
                mask = None

        key_valid = None  # (B, pos + T) bool for attention
        if state is not None:
            state.reserve(t)
            if mask is not None:
                state.valid[:, pos:pos + t] = mask.to(state.valid.device)
                state.has_pads = True
            else:
                state.valid[:, pos:pos + t] = True
            if state.has_pads:
                key_valid = state.valid[:, :pos + t]
        else:
            key_valid = mask
        attn_mask = causal_mask(t, pos + t, key_valid, x.device) if "attention" in self.config.layer_kinds else None

        if self.config.residual_in_fp32:
            x = x.float()
        where = Positions(mask=mask, attn_mask=attn_mask, pos=pos)
        for i, blk in enumerate(self.backbone.layers):
            x = blk(x, None if state is None else state.layers[i], where)
        if state is not None:
            state.seqlen += t  # the one place the position counter advances
        return self.backbone.norm_f(x.to(self.backbone.norm_f.weight.dtype))

    # ------------------------------------------------------------------ initialisation
    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> "HybridLM":
        """A from-scratch initialisation (the constructors leave placeholders: A = -1, dt_bias = 0), drawn
        from ``generator`` parameter by parameter in ``named_parameters`` order. Linear and embedding
        weights N(0, 0.02), the residual output projections (o_proj, out_proj, down_proj) scaled by
        1 / sqrt(2 * layers); norms 1, biases 0; Mamba A in [-16, -1] (A_log = log(1 + 15 u)) and
        softplus(dt_bias) log-uniform in [1e-3, 1e-1] (the Mamba2 recipe), D = 1; conv1d keeps torch's
        default (drawn from the global RNG when the module was built)."""
        n_layers = self.config.num_hidden_layers
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "A_log":
                p.copy_(torch.log(1 + 15 * torch.rand(p.shape, generator=generator)))
            elif leaf == "dt_bias":
                u = torch.rand(p.shape, generator=generator)
                dt = torch.exp(math.log(1e-3) + (math.log(1e-1) - math.log(1e-3)) * u)
                p.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
            elif leaf == "D":
                p.fill_(1.0)
            elif "conv1d" in name:
                continue
            elif leaf == "bias":
                p.zero_()
            elif p.dim() == 1:  # RMSNorm weights
                p.fill_(1.0)
            else:
                std = 0.02
                if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                    std /= math.sqrt(2 * n_layers)
                p.copy_(torch.randn(p.shape, generator=generator) * std)
        return self

    # ------------------------------------------------------------------ misc
    def _apply(self, fn, recurse=True):
        """``.half()`` / ``.to(torch.bfloat16)`` leave the ``keep_fp32`` parameters in fp32."""
        kept = {n for n, p in self.named_parameters() if n.endswith(self.keep_fp32) and p.dtype == torch.float32}
        super()._apply(fn, recurse)
        for n, p in self.named_parameters():
            if n in kept and p.dtype in (torch.float16, torch.bfloat16):
                p.data = p.data.float()
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.backbone.embeddings.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.backbone.embeddings.weight.device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

"""The FP8 KV cache (``Engine(kv_dtype=torch.float8_e4m3fn)``, holotron/kv_cache.py): the e4m3 round trip with
a scale per (row, KV head, slot); an FP8 engine's logits against the full-precision engine's, with a tolerance
that a wrong scale fails; sessions under FP8 (batching, chunked prefill, mixed passes, forks, saving to the host
and back, prefixes) equal to the same session alone under FP8; the attention kernels reading FP8 caches against
the PyTorch reference (Triton's CPU interpreter here, the GPU under ``-m gpu``); the bytes a row takes; bad
``kv_dtype`` values refused in one line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_engine_sessions import _drive
from tiny_lm import random_ids as _ids
from tiny_lm import scan_backend_of_the_device, tiny_config, tiny_lm  # noqa: F401 (autouse fixture)

import holotron.kv_cache as kv_cache
from holotron.config import TextConfig
from holotron.decode_ops import fused_decode
from holotron.engine import Engine, engine_for, release, row_bytes
from holotron.kernels import available_backends
from holotron.kv_cache import FP8, dequantize_kv, kv_dtype_for, quantize_kv, raw
from holotron.lm import HybridLM
from holotron.state import DecodeState, KVCache

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif("triton" not in available_backends(DEV), reason="triton not installed")
E4M3 = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).float()   # every code's value
E4M3 = E4M3[torch.isfinite(E4M3)]


@pytest.fixture(scope="module")
def model():
    return tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=5)


def _with_outliers(*shape, seed: int) -> torch.Tensor:
    """Random vectors (..., hd), a few elements 30-300x larger (the large key outliers of real checkpoints)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    spikes = torch.rand(*shape, generator=g) < 0.02
    return torch.where(spikes, x * torch.empty(shape).uniform_(30, 300, generator=g), x)


# ------------------------------------------------------------------------------------------------ the format


def test_round_trip_error_is_at_most_a_sixteenth_per_element_and_exact_for_codes_times_scale():
    x = _with_outliers(3, 4, 50, 24, seed=0)
    x[0, 0, 0] = 0.0                                   # a vector of zeros: scale 0, decodes to zeros
    x[1, 2, 3, :5] = 1e-30                             # elements far below the slot's scale (e4m3 subnormals)
    codes, scale = quantize_kv(x)
    assert codes.dtype == FP8 and codes.shape == x.shape and scale.dtype == torch.float32 and scale.shape == x.shape[:3]
    torch.testing.assert_close(scale, x.abs().amax(-1) / 448, rtol=0, atol=0)
    assert float(codes.float().abs().amax(-1)[scale > 0].min()) == 448.0   # each slot's largest element hits 448
    back = dequantize_kv(codes, scale, torch.float32)
    err = (back - x).abs()
    bound = x.abs() / 16 + scale[..., None] * 2.0 ** -10   # 3 mantissa bits; half a subnormal step below 2^-6
    assert bool((err <= bound * (1 + 1e-6)).all()), float((err - bound).max())
    assert torch.equal(back[0, 0, 0], torch.zeros(24))
    # values already of the form code * scale (one element at +-448 per slot): exact, in fp32 and in bf16
    g = torch.Generator().manual_seed(1)
    c = E4M3[torch.randint(0, E4M3.numel(), (4, 2, 9, 16), generator=g)]
    c[..., 0] = 448.0 * torch.sign(torch.randn(4, 2, 9, generator=g))
    s = 2.0 ** torch.randint(-12, 6, (4, 2, 9), generator=g).float()
    exact = c * s[..., None]
    codes, scale = quantize_kv(exact)
    assert torch.equal(scale, s) and torch.equal(dequantize_kv(codes, scale, torch.float32), exact)
    assert torch.equal(dequantize_kv(*quantize_kv(exact.bfloat16()), torch.bfloat16), exact.bfloat16())


def test_an_inference_state_prefilled_in_pieces_equals_one_call_and_selects_rows(model):
    """The plain forward with an FP8 cache (``Attention.forward``: quantized writes, dequantized reads of the
    slots in use): three calls (the cache grows twice) give the logits of one; ``select`` keeps a row."""
    ids = torch.stack([_ids(23, seed=1), _ids(23, seed=2)])
    with torch.no_grad():
        one = model(ids, state=model.new_state(2, kv_dtype=FP8))
        st = model.new_state(2, kv_dtype=FP8)
        parts = [model(ids[:, a:b], state=st) for a, b in ((0, 7), (7, 15), (15, 23))]
        kv = [s for s in st.layers if isinstance(s, KVCache)]
        assert kv and all(s.quantized and s.k.dtype == FP8 and s.k_scale.shape == s.k.shape[:3] for s in kv)
        torch.testing.assert_close(torch.cat(parts, 1), one, rtol=1e-5, atol=1e-5)
        st.select(torch.tensor([1]))
        nxt = model(_ids(4, seed=3)[None], state=st)
        ref = model.new_state(1, kv_dtype=FP8)
        model(ids[1:], state=ref)
        torch.testing.assert_close(nxt, model(_ids(4, seed=3)[None], state=ref), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ accuracy


TURNS = [(_ids(30, seed=1), 8), (_ids(12, seed=2), 8), (_ids(9, seed=3), 8)]


def _session_logits(model, kv_dtype, turns=None, max_batch: int = 1, max_len: int = 256):
    """One session's turns (default TURNS) on an engine: each turn's tokens and its decode steps' logits."""
    eng = Engine(model, max_batch=max_batch, max_len=max_len, kv_dtype=kv_dtype, keep_logits=True)
    s = eng.session()
    out = []
    for p, n in (TURNS if turns is None else turns):
        r = eng.submit(p, session=s, max_new_tokens=n)
        logits = []
        while not eng.idle:
            before = eng.stats["decode_steps"]
            eng.step()
            if eng.stats["decode_steps"] > before:
                logits.append(eng.logits[0].clone())
        out.append((r.tokens, torch.stack(logits)))   # logits[k]: the step that chose token k + 1
    return out


def _same_history_logits(a, b):
    """The decode steps of two runs of ``TURNS`` whose histories are the same tokens (all of them when the
    tokens agree; up to the first token that differs otherwise), as two stacked logits tensors."""
    la, lb = [], []
    for (ta, xa), (tb, xb) in zip(a, b):
        for k in range(len(xa)):
            if ta[:k + 1] != tb[:k + 1]:
                return torch.stack(la), torch.stack(lb)
            la.append(xa[k])
            lb.append(xb[k])
        if ta != tb:
            break
    return torch.stack(la), torch.stack(lb)


def _rel_rms(a, b) -> float:
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


# e4m3 rounds each key and value element with a relative error uniform in +-2^-4 (RMS 2^-4 / sqrt(3), 3.6 %);
# the logits go through the attention layers and also through the Mamba, MLP and embedding paths, which FP8
# leaves exact, so their relative RMS error stays under that of the elements themselves: 2^-5 (3.1 %). (This
# model: 0.9 %.) Scales 10 % off (every element of every slot 10 % too large) give 5 % and fail it.
LOGITS_RTOL = 2.0 ** -5


def test_fp8_engine_logits_stay_close_to_the_full_precision_engine(model, monkeypatch):
    full = _session_logits(model, None)
    fp8 = _session_logits(model, FP8)
    assert [t for t, _ in fp8] == [t for t, _ in full]   # the same greedy tokens: every step compares like with like
    a, b = _same_history_logits(fp8, full)
    assert a.shape[0] == sum(n - 1 for _, n in TURNS)
    assert _rel_rms(a, b) < LOGITS_RTOL
    orig = kv_cache.quantize_kv
    monkeypatch.setattr(kv_cache, "quantize_kv", lambda x: (lambda c, s: (c, s * 1.1))(*orig(x)))
    a, b = _same_history_logits(_session_logits(model, FP8), full)
    assert a.shape[0] >= 7 and _rel_rms(a, b) > LOGITS_RTOL   # the tolerance catches a broken scale


# ------------------------------------------------------------------------------------------------ sessions


def _alone_fp8(model, turns, **kw):
    """The same conversation alone on a one-row FP8 engine (turn by turn, nothing else in the engine)."""
    return _drive(Engine(model, max_batch=1, max_len=256, kv_dtype=FP8, **kw), [turns])[0][0]


@pytest.mark.parametrize("mode", ["mixed", "separate", "overlap", "static"])
def test_fp8_sessions_with_admissions_mixed_into_decoding_equal_each_alone(model, mode):
    """As ``test_many_sessions_with_admissions_mixed_into_decoding_equal_each_alone`` (tests/test_engine_sessions.py)
    on an FP8 engine: 5 agents, 4 rows (sessions saved to the host and restored), chunks across steps, short prompts
    read by decode steps (separate / overlap), mixed passes, static chunks."""
    agents = [[(_ids(5 + 3 * a + t, seed=10 * a + t), 3 + (a + t) % 4) for t in range(3)] for a in range(5)]
    eng = Engine(model, max_batch=4, max_len=192, prefill_tokens=12, overlap=mode == "overlap",
                 mixed=mode == "mixed", prefill_graphs=mode == "static", kv_dtype=FP8)
    got, sess = _drive(eng, agents)
    for a, turns in enumerate(agents):
        assert got[a] == _alone_fp8(model, turns), f"agent {a}"
    assert eng.memory()["sessions"] == 5 and eng.memory()["kv_dtype"] == FP8


def test_fp8_forks_saves_restores_and_prefixes_leave_no_trace(model):
    eng = Engine(model, max_batch=2, max_len=128, kv_dtype=FP8)   # two rows: the second fork goes to host memory
    s = eng.session()
    first = _ids(10, seed=4)
    eng.submit(first, session=s, max_new_tokens=4)
    eng.run()
    a, b = eng.fork(s, 2)
    assert a.row is not None and b.on_host
    part = b.snapshot.parts[[i for i, p in enumerate(b.snapshot.parts) if p is not None][1]]
    assert len(part) == 4 and part[0].dtype == torch.uint8 and part[2].dtype == torch.float32  # codes and scales
    eng.save(a)
    assert a.on_host and a.snapshot.nbytes() == b.snapshot.nbytes()
    tasks = {a: _ids(4, seed=5), b: _ids(6, seed=6), s: _ids(2, seed=7)}
    reqs = {k: eng.submit(v, session=k, max_new_tokens=5) for k, v in tasks.items()}
    eng.run()
    for k, v in tasks.items():
        assert reqs[k].tokens == _alone_fp8(model, [(first, 4), (v, 5)])[1]
    # a shared prefix (prefilled once into an FP8 InferenceState, copied into rows) against whole prompts
    screen = _ids(14, seed=8)
    pre = eng.prefix(screen)
    conts = [eng.submit(_ids(3 + i, seed=9 + i), prefix=pre, max_new_tokens=4) for i in range(3)]
    eng.run()
    for i, c in enumerate(conts):
        assert c.tokens == _alone_fp8(model, [(torch.cat([screen, _ids(3 + i, seed=9 + i)]), 4)])[0]


def test_fp8_decode_through_the_attention_kernel_equals_the_plain_path(model):
    """``fused_decode("on")``: the decode steps' attention is the Triton kernel reading codes and scales (CPU
    interpreter), the other steps the plain dequantizing path: the same tokens."""
    if "triton" not in available_backends("cpu"):
        pytest.skip("triton not installed")
    agents = [[(_ids(9, seed=40 + a), 5), (_ids(4, seed=50 + a), 4)] for a in range(2)]
    with fused_decode("on"):
        got, _ = _drive(Engine(model, max_batch=2, max_len=128, kv_dtype=FP8), agents)
    with fused_decode("off"):
        want, _ = _drive(Engine(model, max_batch=2, max_len=128, kv_dtype=FP8), agents)
    assert got == want


# ------------------------------------------------------------------------------------------------ kernels


def _fp8_cache(rows, hkv, L, hd, seed, device, strided=True):
    """An FP8 cache (codes, scales) of random keys with outliers; a strided view (rows of a larger state)."""
    x = _with_outliers(rows + 2, hkv, L, hd, seed=seed).to(device)
    codes, scale = quantize_kv(x)
    return (codes[1:rows + 1], scale[1:rows + 1]) if strided else (codes[:rows], scale[:rows])


def _poison_after(codes, scales, ends):
    """NaN codes (0x7F) and scales in every slot at or past ``ends[row]`` of each row: slots that must not be read."""
    codes, scales = codes.clone(), scales.clone()
    for r, e in ends.items():
        raw(codes)[r, :, e:] = 0x7F
        scales[r, :, e:] = float("nan")
    return codes, scales


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)])
def test_decode_attention_kernel_reads_fp8_caches(dtype):
    from holotron.kernels.attn_decode_triton import attn_decode_triton

    b, hkv, r, hd, L = 4, 2, 5, 24, 600
    q = torch.randn(b, hkv, r, hd, generator=torch.Generator().manual_seed(4)).to(DEV, dtype)
    k8, ks = _fp8_cache(b, hkv, L, hd, 5, DEV)
    v8, vs = _fp8_cache(b, hkv, L, hd, 6, DEV)
    n = torch.tensor([1, 70, 257, 600], device=DEV)
    mask = (torch.arange(L, device=DEV)[None, :] < n[:, None])[:, None, None]
    want = F.scaled_dot_product_attention(q.float(), dequantize_kv(k8, ks, torch.float32),
                                          dequantize_kv(v8, vs, torch.float32), attn_mask=mask)
    got = attn_decode_triton(q, k8, v8, n, ks, vs)
    assert got.dtype == dtype and got.shape == q.shape
    tol = 1e-4 if dtype == torch.float32 else 2e-2   # outlier keys (x300) give scores ~100: fp32 rounds them at 1e-5
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    ends = dict(enumerate(n.tolist()))
    (k2, ks2), (v2, vs2) = _poison_after(k8, ks, ends), _poison_after(v8, vs, ends)
    torch.testing.assert_close(attn_decode_triton(q, k2, v2, n, ks2, vs2), got, rtol=0, atol=0)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)])
def test_chunk_attention_kernel_reads_fp8_caches(dtype):
    from holotron.kernels.attn_chunk_triton import chunk_attention_reference, chunk_attention_triton

    b, t, hq, hkv, hd, L = 4, 70, 4, 2, 24, 200
    q = torch.randn(b, t, hq, hd, generator=torch.Generator().manual_seed(3)).to(DEV, dtype)
    k8, ks = _fp8_cache(6, hkv, L, hd, 7, DEV)
    v8, vs = _fp8_cache(6, hkv, L, hd, 8, DEV)
    rows = torch.tensor([5, 0, 3, 2], device=DEV)
    starts = torch.tensor([40, 0, 129, 7], device=DEV)
    counts = torch.tensor([70, 33, 1, 5], device=DEV)
    want = chunk_attention_reference(q.float(), k8, v8, rows, starts, counts, ks, vs)
    k32, v32 = dequantize_kv(k8, ks, torch.float32), dequantize_kv(v8, vs, torch.float32)
    ref = chunk_attention_reference(q.float(), k32, v32, rows, starts, counts)
    torch.testing.assert_close(want, ref, rtol=0, atol=0)   # the reference dequantizes the slots it reads
    got = chunk_attention_triton(q, k8, v8, rows, starts, counts, ks, vs)
    assert got.dtype == dtype and got.shape == q.shape
    tol = 1e-4 if dtype == torch.float32 else 2e-2   # as in the decode kernel's test
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    assert torch.equal(got[1, 33:], torch.zeros_like(got[1, 33:]))  # pads give zeros
    ends = {r: s0 + c for r, s0, c in zip(rows.tolist(), starts.tolist(), counts.tolist())}
    (k2, ks2), (v2, vs2) = _poison_after(k8, ks, ends), _poison_after(v8, vs, ends)
    torch.testing.assert_close(chunk_attention_triton(q, k2, v2, rows, starts, counts, ks2, vs2), got, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------ bytes, errors


def test_fp8_rows_take_about_half_the_bytes_at_12b_size():
    with torch.device("meta"):
        lm = HybridLM(TextConfig()).to(torch.bfloat16)
    per16 = DecodeState.allocate(lm, 1, 4096).bytes_per_row(4096)
    per8 = DecodeState.allocate(lm, 1, 4096, kv_dtype=FP8).bytes_per_row(4096)
    assert per8["attention"] == 6 * 2 * 8 * (128 + 4) * 4096   # codes and fp32 scales: 12.4 KiB per token
    assert per8["attention"] / per16["attention"] == 132 / 256 and per8["mamba"] == per16["mamba"]
    assert row_bytes(lm, 4096, kv_dtype=FP8) == per8 and row_bytes(lm, 4096) == per16
    # a twelve-tile agent's 27k tokens of history with a bf16 Mamba state: 0.43 GB instead of 0.74
    h = 27 * 1024
    assert row_bytes(lm, h, torch.bfloat16, FP8)["total"] < 0.6 * row_bytes(lm, h, torch.bfloat16)["total"]


def test_fp8_memory_accounting_matches_the_allocated_rows(model):
    eng = Engine(model, max_batch=3, max_len=128, kv_dtype=FP8)
    mem, per = eng.memory(), row_bytes(model, eng.max_len, kv_dtype=FP8)
    assert mem["row_bytes"] == per["total"] == eng.state.bytes_per_row()["total"]
    assert mem["row_kv_bytes"] < 0.5 * row_bytes(model, eng.max_len)["attention"]   # fp32 model: 48 vs 128 B a token
    assert Engine.rows_that_fit(model, eng.max_len, 10 * per["total"] + 1, kv_dtype=FP8) == 10
    tensors = [t for s in eng.state.layers if s is not None for t in (s.tensors() if isinstance(s, KVCache)
                                                                       else (s.conv, s.ssm))]
    assert eng.state.nbytes() == sum(t.nbytes for t in tensors) + eng.state.lengths.nbytes
    s = eng.session()
    eng.submit(_ids(20, seed=1), session=s, max_new_tokens=3)
    eng.run()
    eng.save(s)
    used = eng.state.bytes_per_row(s.length)
    assert s.snapshot.nbytes() == used["total"]


def test_bad_kv_dtypes_get_one_clear_error(model, monkeypatch):
    for bad in (torch.int8, torch.float8_e5m2, "fp8"):
        with pytest.raises(ValueError, match=r"Engine: kv_dtype=.* is not supported; pass kv_dtype=None \(the "
                                             r"model's dtype\) or kv_dtype=torch.float8_e4m3fn"):
            Engine(model, 1, 64, kv_dtype=bad)
    assert Engine(model, 1, 64, kv_dtype=model.dtype).kv_dtype is None   # the model's own dtype: as None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A100")
    with pytest.raises(ValueError, match="compute capability 8.9 or newer .* is 8.0; pass kv_dtype=None"):
        kv_dtype_for(FP8, "cuda:0")
    with pytest.raises(ValueError, match="not on mps; pass kv_dtype=None"):
        kv_dtype_for(FP8, "mps")
    with pytest.raises(ValueError, match="row_bytes: kv_dtype=torch.int8 is not supported"):
        row_bytes(model, 64, kv_dtype=torch.int8)
    plain = model.new_state(1)
    model(_ids(5, seed=1)[None], state=plain)
    with pytest.raises(ValueError, match="differ in format"):
        DecodeState.allocate(model, 1, 64, kv_dtype=FP8).load(0, plain, 0)


def test_engine_for_keeps_one_engine_per_kv_dtype(model):
    a = engine_for(model, 1, 40)
    b = engine_for(model, 1, 40, kv_dtype=FP8)
    assert b is not a and b.kv_dtype == FP8 and engine_for(model, 1, 30, kv_dtype=FP8) is b
    assert engine_for(model, 1, 30) is not b
    release(model)


# ------------------------------------------------------------------------------------------------ GPU


def _cuda_model():
    """A tiny bf16 hybrid on CUDA with the real model's attention head size (128)."""
    cfg = tiny_config(hybrid_override_pattern="M*M*", hidden_size=256, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=128, mamba_num_heads=4, mamba_head_dim=64, ssm_state_size=32, chunk_size=16)
    return tiny_lm(cfg, seed=3).cuda().to(torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["graphs", "mixed"])
def test_gpu_fp8_sessions_on_cuda_graphs_equal_each_alone(mode):
    """CUDA graphs of the decode step, the chunks (or mixed passes) and the row swap, with the decode and chunk
    kernels reading FP8 codes: each agent's tokens equal its session alone on a one-row FP8 engine."""
    model = tiny_lm(tiny_config(hybrid_override_pattern="M*-M*"), seed=7).cuda()
    agents = [[(_ids(5 + 20 * a + t, seed=10 * a + t).cuda(), 3 + (a + t) % 4 + 3 * a) for t in range(3)]
              for a in range(6)]
    eng = Engine(model, max_batch=4, max_len=512, prefill_tokens=24, mixed=mode == "mixed", step_prompt_max=32,
                 kv_dtype=FP8)
    assert eng.cuda_graph and eng.prefill_graphs
    got, _ = _drive(eng, agents)
    assert eng.memory()["sessions"] == 6 and eng.graphs and (len(eng.mixed_graphs) > 0) == (mode == "mixed")
    for a, turns in enumerate(agents):
        want = _drive(Engine(model, max_batch=1, max_len=512, kv_dtype=FP8, cuda_graph=False), [turns])[0][0]
        assert got[a] == want, f"agent {a}"


@pytest.mark.gpu
def test_gpu_fp8_engine_logits_close_to_bf16_at_head_size_128():
    """The bf16 model at the real model's head size through the CUDA-graph engine: FP8 decode logits within the
    CPU test's tolerance of the bf16 cache's, where the histories agree."""
    model = _cuda_model()
    turns = [(_ids(300, seed=1).cuda(), 8), (_ids(40, seed=2).cuda(), 8), (_ids(9, seed=3).cuda(), 8)]
    runs = {kv: _session_logits(model, kv, turns, max_batch=2, max_len=1024) for kv in (None, FP8)}
    a, b = _same_history_logits(runs[FP8], runs[None])
    assert a.shape[0] >= 7 and _rel_rms(a, b) < LOGITS_RTOL

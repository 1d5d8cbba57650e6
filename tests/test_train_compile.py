"""The training step's speed options leave what it computes unchanged: ``--compile`` (holotron/train/compiled.py:
the same loss and gradients as the eager modules, the checkpoint's parameter names unchanged) and
``--length-multiple`` (rows padded to a multiple: the same loss and gradients as the batch's own length)."""

from __future__ import annotations

import copy

import pytest
import torch

from holotron.model import Holotron
from holotron.processor import Processor
from holotron.tokenizer import build_task_tokenizer
from holotron.train import AuxHeads, ScreenBatches, init_weights, loss_fn, make_config
from holotron.train.compiled import compile_modules


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_task_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=600, n=40)


def test_compiled_modules_give_the_eager_loss_and_gradients(tok_dir):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    vocab = Processor.from_pretrained(tok_dir).vocab_size
    cfg = make_config("micro", vocab)
    eager = init_weights(Holotron(cfg), seed=0)
    aux = AuxHeads(cfg)
    comp = copy.deepcopy(eager)
    n = compile_modules(comp)
    kinds = cfg.text.layer_kinds
    assert n == len(comp.vision_model.radio_model.model.blocks) + 1 + sum(2 if k == "mamba" else 1 for k in kinds)
    assert list(comp.state_dict()) == list(eager.state_dict())  # in place: the checkpoint's names
    for seed in (3, 4):  # two batches of different lengths: the second recompiles with dynamic sizes
        batch = ScreenBatches(tok_dir, cfg.vision, batch_size=2, seed=seed, queries=2)[0]
        losses, grads = [], []
        for model in (eager, comp):
            model.zero_grad(set_to_none=True)
            aux.zero_grad(set_to_none=True)
            loss, _ = loss_fn(model, batch, torch.device("cpu"), aux, 0.5, pointer_weight=1.0, pointer_heads=2)
            loss.backward()
            losses.append(float(loss.detach()))
            grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)
        assert grads[0].keys() == grads[1].keys() and len(grads[0]) >= 40
        for k, g in grads[0].items():
            scale = g.abs().max().clamp_min(1e-6)
            assert float((grads[1][k] - g).abs().max() / scale) < 1e-3, k
    assert counters["stats"]["unique_graphs"] >= n  # the compiled modules ran as graphs, not eagerly


def test_rows_padded_to_a_multiple_give_the_same_loss_and_gradients(tok_dir):
    vocab = Processor.from_pretrained(tok_dir).vocab_size
    cfg = make_config("micro", vocab)
    model = init_weights(Holotron(cfg), seed=0)
    aux = AuxHeads(cfg)
    kw = dict(batch_size=2, seed=5, queries=3, match=True)
    plain = ScreenBatches(tok_dir, cfg.vision, **kw)[0]
    padded = ScreenBatches(tok_dir, cfg.vision, length_multiple=64, **kw)[0]
    T0, T1 = plain["input_ids"].shape[1], padded["input_ids"].shape[1]
    assert T1 % 64 == 0 and T0 <= T1 < T0 + 64 and T1 > T0  # (this seed's rows are not a multiple already)
    assert torch.equal(padded["input_ids"][:, :T0], plain["input_ids"])
    out = []
    for batch in (plain, padded):
        model.zero_grad(set_to_none=True)
        aux.zero_grad(set_to_none=True)
        parts = {}
        loss, _ = loss_fn(model, batch, torch.device("cpu"), aux, 0.5, parts, pointer_weight=1.0, pointer_heads=2,
                          match_weight=0.5)
        loss.backward()
        out.append((float(loss.detach()), parts, {k: p.grad.clone() for k, p in model.named_parameters()
                                                  if p.grad is not None}))
    assert out[1][0] == pytest.approx(out[0][0], rel=1e-5)
    assert out[1][1].keys() == out[0][1].keys() and "pointer" in out[0][1]
    for k, g in out[0][2].items():
        assert torch.allclose(out[1][2][k], g, rtol=1e-4, atol=1e-6 * float(g.abs().max())), k
    with pytest.raises(ValueError, match="length_multiple"):
        ScreenBatches(tok_dir, cfg.vision, length_multiple=0, **kw)


@pytest.mark.skipif(not hasattr(torch.compiler, "set_stance"), reason="torch < 2.6 has no compile stance")
def test_the_grounding_eval_runs_compiled_modules_eagerly(tok_dir, monkeypatch):
    """The evals generate through the engine, whose Triton kernels inductor must not trace (a compiled attention
    block once passed the kernel's float scale as fp64 and failed on the GPU): under ``--compile`` the
    grounding eval runs with torch.compile's stance "force_eager"."""
    from types import SimpleNamespace

    import holotron.train.evals as evals

    seen = []
    probe = torch.compile(lambda x: seen.append(torch.compiler.is_compiling()) or x + 1, backend="eager")
    probe(torch.ones(2))  # outside the eval: traced
    monkeypatch.setattr(evals, "grounding_eval", lambda *a, **k: {"probe": bool(probe(torch.ones(2)).sum())})
    vocab = Processor.from_pretrained(tok_dir).vocab_size
    model = init_weights(Holotron(make_config("micro", vocab)), seed=0)
    args = SimpleNamespace(stage="ground", eval_every=1, eval_n=1, eval_split="heldout", queries=2,
                           followups="short")
    evaluator = evals.make_evaluator(args, model, None, tok_dir, torch.device("cpu"), None, print)
    assert evaluator(1) == {"probe": True}
    assert seen == [True, False]

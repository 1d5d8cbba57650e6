"""Shared test setup: Triton's CPU interpreter when there is no GPU, hypothesis profiles, helpers."""

import os

# Triton runs on the CPU through its interpreter; this must be set before triton is imported.
try:
    import torch as _torch

    if not _torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover
    pass

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", deadline=None, max_examples=25, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough", deadline=None, max_examples=300,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _no_tf32():
    """fp32 comparisons must not silently run in TF32 on a GPU."""
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def word_tok(tmp_path_factory):
    """The small word tokenizer (40 screens) the training-screen option and matching tests build batches with."""
    from holotron.tokenizer import build_task_tokenizer

    return build_task_tokenizer(tmp_path_factory.mktemp("wtok"), n=40, kind="word")


@pytest.fixture(scope="module")
def micro_ckpt(tmp_path_factory):
    """A random micro VL model saved with a small task tokenizer (the eval tests' checkpoint)."""
    import torch

    from holotron.model import Holotron
    from holotron.processor import Processor
    from holotron.tokenizer import build_task_tokenizer
    from holotron.train import init_weights, make_config, save_checkpoint

    tok = build_task_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=600, n=20)
    vocab = Processor.from_pretrained(tok).vocab_size
    model = init_weights(Holotron(make_config("micro", vocab)), seed=0)
    return save_checkpoint(model, tmp_path_factory.mktemp("ck") / "m", tok, dtype=torch.float32)

"""Fixtures shared by the core tests."""

from __future__ import annotations

import functools

import pytest
import torch

from oxygen_ros.core.engine import compiled
from oxygen_ros.core.tokenizer import build_tokenizer


@pytest.fixture(scope="module", params=[512, 2048])
def tok(request):
    """The project's generated tokenizer at two vocabulary sizes."""
    return build_tokenizer(request.param)


@pytest.fixture
def fullgraph(monkeypatch):
    """Stages compile with dynamo's ``eager`` backend and ``fullgraph=True``."""
    real = torch.compile

    def compile_(fn, mode=None, dynamic=False):
        return real(fn, backend="eager", dynamic=dynamic, fullgraph=True)

    monkeypatch.setattr(compiled.torch, "compile", compile_)


@pytest.fixture
def no_recompile():
    """Turns on ``error_on_recompile`` (call it after warm-up); restored after the test."""
    cfg = torch._dynamo.config
    old = cfg.error_on_recompile
    yield functools.partial(setattr, cfg, "error_on_recompile", True)
    cfg.error_on_recompile = old

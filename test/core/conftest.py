"""Fixtures shared by the core tests."""

from __future__ import annotations

import pytest

from oxygen_ros.core.tokenizer import build_tokenizer


@pytest.fixture(scope="module", params=[512, 2048])
def tok(request):
    """The project's generated tokenizer at two vocabulary sizes."""
    return build_tokenizer(request.param)

"""The ``device`` parameter (:func:`oxygen_ros.ros.model_setup.resolve_device`): every device this
machine does not have is an error naming the parameter and what the machine has. The node's side
(configure fails, /diagnostics says so) is in test_node_bad_checkpoint.py; the CUDA-present cases
here run on this machine's torch with CUDA's answers replaced (no GPU on the CI machines)."""

from __future__ import annotations

import pytest
import torch

from oxygen_ros.ros.model_setup import resolve_device

pytestmark = pytest.mark.ros


@pytest.mark.parametrize(
    "value, says",
    [
        ("nonsense", "parameter device='nonsense' is not a torch device name; this machine has ['cpu'"),
        ("cuda:-1", "parameter device='cuda:-1' is not a torch device name"),
        ("meta", "parameter device='meta': not a device the node runs on; this machine has ['cpu'"),
        ("cpu:1", "parameter device='cpu:1': not a device the node runs on"),
    ],
)
def test_unknown_devices_name_the_parameter(value, says):
    with pytest.raises(ValueError) as e:
        resolve_device(value)
    assert says in str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_names_the_parameter():
    assert resolve_device("") == torch.device("cpu") and resolve_device("cpu") == torch.device("cpu")
    for value in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match=rf"parameter device='{value}': .*; this machine has \['cpu'\]"):
            resolve_device(value)


def test_cuda_index_beyond_the_device_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"GPU{i}")
    assert resolve_device("") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1) and resolve_device("cuda") == torch.device("cuda")
    with pytest.raises(ValueError) as e:
        resolve_device("cuda:2")
    assert str(e.value).startswith(
        "parameter device='cuda:2': there are 2 CUDA device(s) (cuda:0 GPU0, cuda:1 GPU1); "
        "this machine has ['cpu', 'cuda', 'cuda:0', 'cuda:1'"
    )

"""The pi0.5 model: SigLIP vision, Gemma MoT layers with adaRMS, flow sampling, text sampling, checkpoint IO.

May import oxygen_ros.core's config/types/untrusted only; never cache or engine.

Importing it checks the installed torch against :data:`MIN_TORCH` (the paged attention of the
engine is ``torch.nn.attention.flex_attention`` with block masks, and compiled CUDA graphs use
``torch.compiler.cudagraph_mark_step_begin``): an older torch fails here with what to install,
not deep inside a forward pass.
"""

from __future__ import annotations

import re

#: The oldest torch the code runs on (tested: the pinned 2.13 on CPU, 2.11 on the GPU machines).
MIN_TORCH = (2, 6)


def check_torch_version(version: str) -> None:
    """Raise ``ImportError`` when the torch ``version`` string (``'2.5.1+cu124'``) is older than
    :data:`MIN_TORCH`, naming where to get a newer one."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None or (int(m[1]), int(m[2])) < MIN_TORCH:
        need = ".".join(map(str, MIN_TORCH))
        raise ImportError(
            f"oxygen_ros needs torch >= {need}, this environment has torch {version}: install a newer "
            "build (requirements.txt pins it; on Jetson see docs/jetson.md for the JetPack index)"
        )


def _check_installed() -> None:
    import torch

    check_torch_version(torch.__version__)


_check_installed()

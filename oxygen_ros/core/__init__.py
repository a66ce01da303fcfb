"""The model core: configs, types, processing, the pi0.5 model, the paged KV cache and the engine.

Plain PyTorch / numpy / transformers; never imports ROS or any other oxygen_ros subpackage.
"""

import logging as _logging
import sys as _sys


class _KnownImportNoise(_logging.Filter):
    """Drops two warnings that torchao's import logs on every start and that say nothing about
    this package's use of it: its CUDA kernel libraries failing to load on a CPU-only torch build
    (on a CUDA build they pass), and torch's deprecation notice for the enums torchao registers
    with ``torch.compile``. transformers imports torchao whenever it is installed (``weights:
    int8`` etc. need it), so without this each tool would open with four alarming lines. Every
    other torchao / torch message passes."""

    def filter(self, record: _logging.LogRecord) -> bool:
        msg = record.getMessage()
        torch = _sys.modules.get("torch")  # imported by torchao before it logs
        cpu_build = torch is not None and getattr(torch.version, "cuda", None) is None
        cpu_only = cpu_build and msg.startswith("Failed to load ") and "/torchao/_C" in msg
        enum_notice = "register_constant() on Enum subclasses is deprecated" in msg
        return not (cpu_only or enum_notice)


_logging.getLogger("torchao").addFilter(_KnownImportNoise())
_logging.getLogger("torch.utils._pytree").addFilter(_KnownImportNoise())

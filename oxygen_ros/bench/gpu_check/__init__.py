"""``gpu_check``: the project's prepared GPU check — staged, timed, results written as they finish.

May import oxygen_ros.core and the rest of oxygen_ros.bench only (no ROS, no OpenCV / psutil /
matplotlib: it runs on a bare PyTorch stack). ``stages`` runs the stages, ``report`` reads their
results back, ``smoke`` is stage ``env``.
"""

from .stages import STAGES, TIMEOUTS, main, parse_args, run_stage

__all__ = ["STAGES", "TIMEOUTS", "main", "parse_args", "run_stage"]

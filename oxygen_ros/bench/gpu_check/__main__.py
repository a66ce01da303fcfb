"""``python -m oxygen_ros.bench.gpu_check``: run the GPU check (:func:`.stages.main`)."""

import sys

from .stages import main

sys.exit(main())

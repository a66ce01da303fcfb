"""``python -m oxygen_ros.ros.cli``: the ``oxygen`` command (:func:`oxygen_ros.ros.cli.main.main`)."""

import sys

from oxygen_ros.ros.cli.main import main

sys.exit(main())

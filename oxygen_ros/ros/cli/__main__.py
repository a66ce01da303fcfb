"""``python -m oxygen_ros.ros.cli``: the ``oxygen`` command (:func:`oxygen_ros.ros.cli.main.entry`)."""

from oxygen_ros.ros.cli.main import entry

entry()

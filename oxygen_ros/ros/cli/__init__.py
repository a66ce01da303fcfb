"""The ``oxygen`` command: operate a running ``oxygen`` node without the ``ros2`` CLI (ask, listen,
status, params, lifecycle), through a short-lived rclpy node of its own (``peer``).

May import oxygen_ros.core and oxygen_ros.ros.* (and rclpy / message packages); nothing imports it
but its console script (``oxygen = oxygen_ros.ros.cli.main:entry``) and ``python -m oxygen_ros.ros.cli``.
"""

"""The ROS 2 layer: the `oxygen` lifecycle node, its parameters, inputs, outputs and diagnostics.

May import oxygen_ros.core (and rclpy / message packages); never bags, replay, bench or sim.
"""

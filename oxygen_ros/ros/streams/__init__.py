"""Output streams of the node: per-task text deltas / utterances and the fixed-rate per-step command stream;
the switch discontinuity between consecutive action chunks (``switches``).

ROS-free state machines (the node publishes what they emit); may import oxygen_ros.core only.
"""

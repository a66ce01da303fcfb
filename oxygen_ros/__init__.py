"""oxygen_ros: a ROS 2 node running a pi0.5 Vision-Language-Action model with unified KV cache management.

Subpackages, each importing only the layers below it: core (no ROS) <- ros, bags <- replay, bench, sim
(enforced by test/test_layout.py).
"""

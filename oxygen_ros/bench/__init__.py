"""The benchmark tool: isolated / shared_kv / unified modes over paper and product workloads, reports and plots.

May import oxygen_ros.core only (no ROS); never replay or sim.
"""

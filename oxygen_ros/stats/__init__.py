"""Normalisation statistics from one's own robot bags: the ``norm_stats`` console tool.

May import oxygen_ros.core, oxygen_ros.ros (the node's parameter file reader) and oxygen_ros.bags;
never replay, bench or sim.
"""

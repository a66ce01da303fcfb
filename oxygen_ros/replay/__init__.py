"""Offline replay of a bag through the node's own pieces (report, plots, output bag) and the `make demo` job.

May import oxygen_ros.core, oxygen_ros.ros and oxygen_ros.bags; never bench or sim.
"""

"""Many-episode evaluation on Ray (the ``evaluate`` command): open-loop action accuracy over bags,
task success over seeded sim episodes; one output folder with a table, a report and plots.

May import oxygen_ros.core, oxygen_ros.ros, oxygen_ros.bags, oxygen_ros.replay and oxygen_ros.sim
(episodes run as their ``replay`` / ``closed_loop`` processes); never bench.
"""

"""Ingress-load benchmark of the ``oxygen`` node: a sensor feed process and the bench driver.

``python -m oxygen_ros.ros.ingress.bench`` (console script ``ingress_bench``) runs the node, a feed
of three 30 Hz cameras whose joint states alternate between 30 Hz and 1 kHz, and a listener, and
reports the chunk-period ratio. May import oxygen_ros.core and oxygen_ros.ros (and rclpy).
"""

"""Engine: language requests, scheduler (pure Python), runner (tensors), streams and the engine facade.

May import everything else in oxygen_ros.core; nothing outside it.
"""

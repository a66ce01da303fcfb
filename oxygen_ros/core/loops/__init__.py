"""Engine schedules: the serial one-loop engine with schedule metrics, the concurrent two-loop engine
(action loop + language batcher loop in its own thread and CUDA stream), and ``make_engine``.

May import everything else in oxygen_ros.core (it builds on oxygen_ros.core.engine); nothing outside it.
"""

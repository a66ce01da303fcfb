"""Real-time chunking (RTC): consecutive action chunks kept consistent at the hand-over.

Black, Galliker, Levine, "Real-Time Execution of Action Chunking Flow Policies" (2025), in the form
LeRobot 0.6.1 ships (``lerobot/policies/rtc``): the new chunk is denoised as an inpainting of the
previous chunk's leftover — frozen where the robot will still execute the old chunk, softly
guided after that, free beyond the execution horizon. Only the action expert's denoise loop
changes; the shared prefix and the language path do not.

* :mod:`.config` — :class:`RTCConfig` (schedules, horizon, delay, guidance mode);
* :mod:`.guidance` — the prefix weights, guidance weights and the guided Euler step (tensors);
* :mod:`.handover` — the engine side: the last chunk, alignment by stamps, relative action spaces,
  the inference-delay estimate, counted reasons for chunks denoised without guidance.

May import ``oxygen_ros.core`` modules below the engine (config, processing, types); the engine
imports it.
"""

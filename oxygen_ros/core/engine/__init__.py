"""Engine: language requests, scheduler (pure Python), runner (tensors) and the engine facade."""

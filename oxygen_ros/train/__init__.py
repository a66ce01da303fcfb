"""Training a π0.5-architecture policy on recorded demonstrations: the ``train`` command.

Reads the sim's demonstration bags (``record_demos``) into frames the policy sees, and runs π0.5's
co-training objective. May import ``core``, ``streams``, ``bags``, ``ros`` (image and joint-state
decoding, as the node does), ``sim`` (the task's language targets) and ``stats``.
"""

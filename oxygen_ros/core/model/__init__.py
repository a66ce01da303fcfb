"""The pi0.5 model: SigLIP vision, Gemma MoT layers with adaRMS, flow sampling, text sampling, checkpoint IO.

May import oxygen_ros.core's config/types/untrusted only; never cache or engine.
"""

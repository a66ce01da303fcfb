"""Training a π0.5-architecture policy on recorded demonstrations (``train``)."""

"""Command-line tools: sample-bag recording, simulation, replay, benchmarks."""

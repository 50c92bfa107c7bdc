"""Tools around the experiments, outside the library: ``python -m benchmarks.benchmark`` (speed,
every figure a ratio against a baseline measured in the same run) and ``python -m
benchmarks.precision`` (float32 against float64 normalized GD on E2)."""

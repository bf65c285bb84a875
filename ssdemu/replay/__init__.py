"""Trace replay: the serving model (tiers, prefill, model configs), the pool of drives, model
mode (sizes only, in this process, on the timing model), data mode (real KV bytes through a
daemon), the replay job the CLI and sweeps share, sweeps on Ray, plots."""

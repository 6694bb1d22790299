"""Latency: devices and runtimes, the measurement protocol, timing tables and predictors (built in later issues)."""

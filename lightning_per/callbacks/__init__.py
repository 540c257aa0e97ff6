"""Lightning callbacks that read device-side metrics without per-step host synchronisations."""

from lightning_per.callbacks.accumulator import MetricAccumulator

__all__ = ["MetricAccumulator"]

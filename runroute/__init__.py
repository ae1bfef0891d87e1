"""runroute: workload-prediction routing for agent runs."""

__version__ = "0.1.0"

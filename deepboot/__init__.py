"""deepboot: schedule elastic training and inference together on one GPU cluster."""

__version__ = "0.1.0"

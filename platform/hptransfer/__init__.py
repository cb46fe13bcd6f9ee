"""hptransfer: tune small widths on Ray, transfer hyperparameters to a large target, train it."""

__version__ = "0.1.0"

"""Tracker: capture every site of an engine run into a ``Capture`` (xarray), in memory or streamed to disk."""

from aligntools.tracker.capture_dataset import Capture, CaptureFileError
from aligntools.tracker.recorder import CaptureBudgetExceeded
from aligntools.tracker.tracker import Tracker, capture

__all__ = ["Capture", "CaptureBudgetExceeded", "CaptureFileError", "Tracker", "capture"]

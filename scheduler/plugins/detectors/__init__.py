"""Built-in saturation detectors that are not filters, one per module (GIE flow control's SaturationDetector)."""

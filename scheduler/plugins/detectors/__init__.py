"""Built-in saturation detectors, one per module (GIE flow control's SaturationDetector);
`utilization-detector` is a filter too."""

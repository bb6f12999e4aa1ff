"""Built-in picker plugins, one per module."""

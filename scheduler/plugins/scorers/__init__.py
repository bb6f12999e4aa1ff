"""Built-in scorer plugins, one per module."""

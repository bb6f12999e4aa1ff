"""Built-in handler plugins, one per module."""

"""Built-in filter plugins, one per module."""

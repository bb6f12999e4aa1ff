"""Built-in request-control responders and screeners (llm-d's requestcontrol plugins), one per module."""

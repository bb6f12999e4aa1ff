"""Built-in decider plugins (llm-d's): whether a disaggregated stage runs for a request."""

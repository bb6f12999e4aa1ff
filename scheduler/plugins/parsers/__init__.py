"""Request parsers llm-d names in `requestHandler.parsers`: the ones the gateway is."""

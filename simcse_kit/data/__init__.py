"""Training data: the readers of text, CSV and JSONL files and the collator (``readers``),
their memory-mapped Arrow cache (``corpus``) and token tables (``tokens``), and the loader
settings for the device (``pipeline``)."""

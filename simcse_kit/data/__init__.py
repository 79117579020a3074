"""Training data: the readers of text, CSV and JSONL files and the collator (``readers``),
and the loader settings for the device (``pipeline``)."""

"""Training data: the readers of text, CSV and JSONL files and the collator (``readers``),
their memory-mapped Arrow cache (``corpus``) and token tables (``tokens``), several datasets
in one run, each batch from one (``mixture``), and the loader settings for the device (``pipeline``)."""

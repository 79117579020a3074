"""Training data: the readers of text, CSV and JSONL files (``readers``), the collator that
makes their examples a batch (``collate``), their memory-mapped Arrow cache (``corpus``) and
token tables (``tokens``), several datasets in one run, each batch from one (``mixture``),
and the loader settings for the device (``pipeline``)."""

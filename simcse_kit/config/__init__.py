"""A run's configuration: one typed dataclass per concern (``sections``), values read by
YAML's scalar rules (``values``), the run's config with its loading, saving and checks
(``run``) and the built-in recipes and data root (``recipes``)."""

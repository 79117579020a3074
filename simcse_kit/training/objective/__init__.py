"""Batch to loss: the SimCSE objective (``objectives``), one per dataset of a mixture
(``mixture``), GradCache, the momentum queue, the teacher's cached vectors."""

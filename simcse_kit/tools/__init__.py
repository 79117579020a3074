"""The offline tools of ``simcse-kit mine`` and ``simcse-kit score``: hard negatives mined from a
corpus (``mining``) and a teacher's scores of the mined rows (``scoring``)."""

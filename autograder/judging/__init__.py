"""The judges' helpers and the trusted references: what is right, computed by the grader's own code.

* ``judges.py``      parent-side expected values and comparisons the judges use
* ``fixtures.py``    rank-side builders: synthetic models, data, secret-seeded gradients, recorders
* ``stepwise.py``, ``margins.py``  judging training with AdamW step by step; how close a judge's tolerance sits
* ``references.py``  the loss-equivalence runs, rank and judge sides (never shipped)

Rooms it may import: the contract (``registry``, ``points``, ``task_table``). The checks (``public/``,
``checks/``) import it. Ships with the release, ``references.py`` excepted.
"""

"""What a grading produces: Gradescope's ``results.json`` and the table (``results.py``), and the
gradebook of a folder of submissions (``gradebook.py``: ``python -m autograder grade-all``; never shipped).

Rooms it may import: the contract (``points``, ``task_table``). ``results.py`` stays light (json, os): the
CLI's stop handler imports it before anything heavy.
"""

"""What a grading produces: Gradescope's ``results.json`` and the table (``report.py``), and the
gradebook of a folder of submissions (``gradebook.py``: ``python -m autograder grade-all``; never shipped).

Rooms it may import: the contract (``points``, ``task_table``). ``report.py`` stays light (json, os): the
CLI's stop handler imports it before anything heavy.
"""

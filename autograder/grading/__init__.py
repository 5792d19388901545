"""Grading one submission: find its code, draw each check's secrets, run every check on fresh ranks,
judge, collect.

* ``runner.py``      the plan, a rank group per check, the verdicts and their messages
* ``submission.py``  finding student code, zip extraction, workspaces over the trusted kit
* ``seeding.py``     the grading key and each check's secrets per rank and submission

Rooms it may import: sandbox, results and the contract (``registry``, ``points``, ``task_table``).
The commands at the top of ``autograder/`` (``cli``, ``notebook``, ``costs``) import it. Ships with the release.
"""

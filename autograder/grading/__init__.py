"""Grading one submission: find its code, draw each check's secrets, run every check on fresh ranks,
judge, collect.

* ``runner.py``      the plan, a rank group per check, the verdicts and their messages
* ``submission.py``  finding student code, zip extraction, workspaces over the trusted kit
* ``seeding.py``     the grading key and each check's secrets per rank and submission
* ``judge_lane.py``  the judges, in a thread beside the next check's ranks
* ``helper_threads.py`` the grader's torch threads, joined before it exits (``end``)

Rooms it may import: sandbox, results and the contract (``registry``, ``points``, ``task_table``).
The commands at the top of ``autograder/`` (``cli``, ``notebook``, ``costs``) import it. Ships with the release.
"""

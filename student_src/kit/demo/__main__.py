"""``python -m student_src.kit.demo``: the command line of ``student_src/kit/demo/assignment.py``."""
import sys

from student_src.kit.demo.assignment import main

if __name__ == "__main__":
    sys.exit(main())

"""``python -m student_src.kit.report``: the command line of ``student_src/kit/report/build.py``."""
import sys

from student_src.kit.report.build import main

if __name__ == "__main__":
    sys.exit(main())

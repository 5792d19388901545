"""``python run_glue.py ...``: the assignment's command, a thin alias of ``python -m student_src.run_glue``."""

import sys

from student_src.run_glue import main

if __name__ == "__main__":
    sys.exit(main())

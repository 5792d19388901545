"""``python -m student_src.kit.whatif``: the command line of ``student_src/kit/whatif/scaling.py``."""
import sys

from student_src.kit.whatif.scaling import main

if __name__ == "__main__":
    sys.exit(main())

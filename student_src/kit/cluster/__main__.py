"""``python -m student_src.kit.cluster``: the command line of ``student_src/kit/cluster/emulated.py``."""
import sys

from student_src.kit.cluster.emulated import main

if __name__ == "__main__":
    sys.exit(main())

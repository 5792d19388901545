"""``python run_glue.py ...``: the assignment's command, a thin alias of ``python -m student_src.run_glue``."""

from student_src.run_glue import main

if __name__ == "__main__":
    from student_src.kit.ranks.process_group import exit_process

    exit_process(main())  # a rank ends without the interpreter's teardown (see exit_process)

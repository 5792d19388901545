"""``python -m student_src.kit.whatif``: the command line of ``student_src/kit/whatif/scaling.py``;
``python -m student_src.kit.whatif plan ...``: the layout planner's (``plan.py``)."""
import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["plan"]:
        from student_src.kit.whatif.plan import main as plan_main

        sys.exit(plan_main(sys.argv[2:]))
    from student_src.kit.whatif.scaling import main

    sys.exit(main())

"""The course kit's student package.

Files at this level are the students' (each has TODOs between solution markers in the
instructor's source); ``student_src.kit`` holds what the course provides.
"""

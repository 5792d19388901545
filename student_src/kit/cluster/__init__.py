"""Clusters: the emulated N-node cluster on one Linux machine (``python -m student_src.kit.cluster``),
its network plumbing, a tiny traffic check, and the files for real clusters (CloudLab, Slurm).

Rooms it may import: the contract and every room below it (plots ... report)."""

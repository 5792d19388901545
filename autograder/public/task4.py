"""Public check for Task 4: ``tensor_nbytes``."""

import torch

from autograder.judging import fixtures
from autograder.registry import CheckFailure, define_check

CASES = [((3, 5), "float32"), ((7,), "float16"), ((2, 3), "int64"), ((4, 4), "bfloat16"), ((), "float64"),
         ((0, 3), "float32")]


@define_check("4.tensor_nbytes", task="4", needs="profiling", points=1,
       title="tensor_nbytes = elements x bytes per element, any dtype",
       promise=("nbytes = number of elements * bytes per element",
                "any dtype (float32, float16, bfloat16, int64, float64), a 0-dim tensor, an empty tensor (0 bytes) "
                "and a non-contiguous view"))
def tensor_nbytes(ctx):
    fn = fixtures.student_function(ctx, "profiling", "tensor_nbytes")
    got = []
    for shape, dtype in CASES:
        got.append(fn(torch.zeros(shape, dtype=getattr(torch, dtype))))
    view = torch.zeros(4, 6)[:, ::2]  # not contiguous: still 12 elements
    got.append(fn(view))
    return {"got": [int(g) if isinstance(g, (int, float)) or hasattr(g, "__int__") else str(g) for g in got]}


@tensor_nbytes.judge
def _(payloads, secrets):
    got = payloads[0]["got"]
    cases = [(s, d, torch.zeros(s, dtype=getattr(torch, d))) for s, d in CASES]
    want = [t.numel() * t.element_size() for _, _, t in cases] + [48]
    names = [f"a {d} tensor of shape {tuple(s)}" for s, d, _ in cases] + ["a float32 view of 12 elements (not contiguous)"]
    for g, w, name in zip(got, want, names):
        if g != w:
            raise CheckFailure(f"tensor_nbytes of {name} returned {g}, expected {w}")

"""Worker functions for Task 11's tests (importable, as spawned ranks require): the student's
context-parallel attentions against one process's attention on the whole sequence."""

import torch
import torch.distributed as dist


def inputs(batch=2, heads=2, seq=8, dim=4, dtype=torch.float64, seed=0, big=1.0, pad_rank_of=None):
    """Whole-sequence q, k, v (``big`` scales q: large logits) and a key mask with padding at the end
    of each row; ``pad_rank_of`` = (C, r): every token of CP rank r padded in row 0 too."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, seq, dim, generator=g, dtype=dtype) for _ in range(3))
    q = q * big
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[0, seq - seq // 4:] = False
    mask[-1, seq // 2 + 1:] = False
    if pad_rank_of is not None:
        c, r = pad_rank_of
        mask[0, r * seq // c:(r + 1) * seq // c] = False
    return q, k, v, mask


def attention_case(ctx, mode, **kw):
    """This rank's output and dq, dk, dv next to the reference's slice (the whole sequence on one
    process), for ``mode``; returns the largest difference of each."""
    from student_src import context_parallel_attn as cp

    q, k, v, mask = inputs(**kw)
    c, r = dist.get_world_size(), dist.get_rank()
    part = q.shape[2] // c
    cut = slice(r * part, (r + 1) * part)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(7), dtype=q.dtype)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    want = cp.attention_reference(*leaves, mask)
    want.backward(grad)
    mine = [t[:, :, cut].clone().requires_grad_(True) for t in (q, k, v)]
    got = cp.context_parallel_attention(*mine, mask[:, cut], None, list(range(c)), mode)
    got.backward(grad[:, :, cut])
    pairs = [(got, want[:, :, cut])] + [(m.grad, w.grad[:, :, cut]) for m, w in zip(mine, leaves)]
    return [float((a - b).detach().abs().max()) for a, b in pairs]


def tiny_bert_case(ctx, mode, seq=16, batch=3, dtype=torch.float64, cp_ranks=None):
    """The kit's tiny BERT (dropout 0, ``dtype``) on one batch with padding, whole on one process and
    cut over the CP group of this rank (``cp_ranks``: the list of CP groups, default the whole world):
    the largest difference of the loss and of any parameter's gradient (after the CP gradient sum)."""
    import copy

    from student_src import context_parallel as cp
    from student_src.kit.core.models import load_model

    groups = cp_ranks or [list(range(dist.get_world_size()))]
    mine = next(g for g in groups if dist.get_rank() in g)
    made = {tuple(g): (dist.new_group(g) if len(groups) > 1 else None) for g in groups}
    group = made[tuple(mine)]
    torch.manual_seed(0)
    model = load_model("tiny", dropout=0.0).to(dtype)
    g = torch.Generator().manual_seed(1 + groups.index(mine))
    ids = torch.randint(1000, 2000, (batch, seq), generator=g)
    ids[:, 0] = 101
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, seq // 2 + 1:] = 0
    mask[1, seq - 2:] = 0
    data = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
            "labels": torch.tensor([0, 1, 1])[:batch]}
    whole = copy.deepcopy(model)
    want = whole(**data).loss
    want.backward()
    cpm = cp.parallelize_bert_for_context(model, group, mine, mode)
    got = cpm(**data).loss
    got.backward()
    cp.sync_context_parallel_grads(cpm, group)
    diffs = [abs(float(got.detach()) - float(want.detach()))]
    named = dict(whole.named_parameters())
    for name, p in cpm.model.named_parameters():
        diffs.append(float((p.grad - named[name].grad).abs().max()))
    return max(diffs)


def ulysses_heads_error(ctx):
    """Ulysses on 3 heads over this world: the one-line ValueError's numbers (heads, C), before anything is sent."""
    import re

    from student_src.context_parallel_ulysses import ulysses_attention

    q, k, v, mask = inputs(heads=3)
    part = q.shape[2] // dist.get_world_size()
    cut = slice(dist.get_rank() * part, (dist.get_rank() + 1) * part)
    try:
        ulysses_attention(q[:, :, cut], k[:, :, cut], v[:, :, cut], mask[:, cut])
    except ValueError as exc:
        assert "\n" not in str(exc)
        return " ".join(re.findall(r"\d+", str(exc))[:2])
    return "no error"

"""Task 6: shard the optimizer state across ranks (ZeRO stage 1), by hand.

What data parallelism replicates
--------------------------------
In Tasks 2a-5 every rank keeps a full copy of three things: the parameters, their gradients and
the optimizer's state. With AdamW the state is two tensors per parameter (``exp_avg`` and
``exp_avg_sq``), so for a model of P parameters in fp32 each rank holds

    parameters 4P + gradients 4P + AdamW state 8P = 16P bytes,

and half of it is optimizer state that every rank updates identically: N ranks compute the same
AdamW update N times, and keep N copies of the same moments.

What ZeRO-1 does (Rajbhandari et al., "ZeRO", SC 2020, stage 1 "P_os")
----------------------------------------------------------------------
Every parameter gets one **owner** rank. Only the owner keeps that parameter's AdamW state and
computes its update. A step then is:

1. gradients are averaged over all ranks *before* the step, as in Task 2b (the kit's training
   loop calls your Task 2b ``allreduce_average`` after ``backward()``; ``train_step`` then clips
   with the global gradient norm, which every rank can compute because every rank holds every
   averaged gradient);
2. each rank steps an ordinary optimizer over the parameters it owns (its *shard*);
3. each parameter is **broadcast from its owner** to every other rank, so that all ranks hold
   identical parameters again before the next forward pass.

What it saves, and what it costs: the optimizer state per rank drops from 8P to about 8P/N bytes
(16P -> 8P + 8P/N per rank with AdamW in fp32: 10P on 4 ranks, 37.5% less). The price is on the
wire: besides the gradient all_reduce (a ring: each rank sends about 2(N-1)/N * 4P bytes per step),
every step broadcasts every parameter once from its owner (gloo's broadcast: the owner sends its
shard to each of the N-1 others, 4P(N-1)/N bytes per rank on average), so about 1.5x the bytes of
Task 2b. (ZeRO-2 would reduce-scatter the gradients instead of all-reducing them, each rank
keeping only its shard's gradients; this task keeps Task 2b's all_reduce.)

How shards are cut: whole parameters, balanced by size. Go through each param group; within it
take the parameters largest first (by bytes, ties in the order they were given) and give each to
the rank that owns the fewest bytes so far (ties: the lowest rank). Every rank runs the same
deterministic rule on the same list, so every rank agrees on every owner without communicating.

Why ``ShardedOptimizer`` is a ``torch.optim.Optimizer``
--------------------------------------------------------
The kit's training loop drives it like any optimizer: ``train_step`` calls ``step()`` and
``zero_grad()``, and the learning-rate scheduler (linear warm-up and decay) changes
``param_groups[i]["lr"]`` on *this* object every step. So this class keeps the full param groups
(every parameter, every setting) in ``self.param_groups``, and keeps the shard's own optimizer in
``self.local_optimizer`` (the kit's memory meter and checkpoints find it under that name) with
one group per group of the wrapper, holding only the owned parameters. Before stepping it,
copy each group's settings (``lr`` and the rest, everything but ``"params"``) from
``self.param_groups[i]`` to ``self.local_optimizer.param_groups[i]``: that is how the scheduler's
learning rate reaches the shard.

The kit uses it as::

    optimizer = ShardedOptimizer(param_groups, torch.optim.AdamW, lr=2e-5, fused=True)
    train_step(model, batch, optimizer, scheduler, sync_gradients=allreduce_average)

and ``run_glue --task 6`` gives the same losses as Task 1 step by step (``--dropout 0``, within
1e-6).

Task 14 uses it again on one axis of an N-D grid (``run_glue --task 14 --dp_shard zero1``): there only
the ranks of one DP group hold the same parameters, so the kit passes ``group=`` (the class docstring
says what changes) and builds one ``ShardedOptimizer`` per group of ranks that share parameters.

Cases the checks test
---------------------
* after every step the parameters are identical on every rank and equal to plain (unsharded)
  AdamW on the whole batch, with two param groups (different weight decay), and a learning rate
  that changes every step in ``self.param_groups`` (as the scheduler's does);
* the optimizer state each rank holds is about 1/N of the whole: every parameter's state lives
  on exactly one rank, and no rank holds more than (whole state)/N plus its largest parameter's
  state (counted from the tensors your optimizer keeps, whatever you name them; a wrapper
  that keeps full AdamW on every rank loses these points);
* tied weights (one Parameter reached under two names appears once in ``model.parameters()``:
  own it once, broadcast it once);
* frozen parameters (``requires_grad=False``) and unused ones: their ``.grad`` is None; they may
  be in the param groups, the optimizer skips them, and they still end identical on every rank;
* uneven shard sizes (parameters of very different sizes, 3 ranks);
* world sizes 1, 2, 3 and 4 (world size 1: one rank owns everything and nothing is sent);
* float64 parameters (a model in double precision): broadcast keeps each parameter's dtype;
* ``step`` calls ``broadcast`` only (one per parameter) to bring the parameters back in sync; the
  gradients are already averaged when ``step`` runs, so no all_reduce here (an all_gather of flat
  shards would work too, but this task's traffic model and checks expect broadcasts);
* training the ``tiny`` BERT on 4 ranks with ``ShardedOptimizer`` around SGD gives the same losses
  as single-node training on the whole batch (within 1e-4).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _rank_and_world(group=None) -> tuple[int, int]:
    """This rank's place in ``group`` and its size (every rank when None; 0 and 1 without a process
    group: one process owns all)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _global_rank(group, rank: int) -> int:
    """The global rank of ``group``'s ``rank``-th member (what ``dist.broadcast``'s ``src`` names), or
    ``rank`` itself without a group."""
    return rank if group is None else dist.get_global_rank(group, rank)


def assign_owners(param_groups, world_size: int) -> dict:
    """``{id(param): owner rank}`` for every parameter of ``param_groups`` (a list of dicts with
    a ``"params"`` list, as ``optimizer.param_groups``), balanced by size.

    The rule (the same on every rank, so every rank agrees without communicating): group after
    group, take the group's parameters largest first (bytes: ``p.numel() * p.element_size()``;
    equal sizes in the order given) and give each to the rank that owns the fewest bytes so far
    (ties: the lowest rank). A parameter that appears twice (a tied weight) is owned once.
    """
    ### BEGIN SOLUTION
    owned_bytes = [0] * world_size
    owners = {}
    for group in param_groups:
        params = [p for p in group["params"] if id(p) not in owners]
        for p in sorted(params, key=lambda t: -t.numel() * t.element_size()):  # stable: ties keep order
            if id(p) in owners:  # the same tensor twice in one group
                continue
            rank = owned_bytes.index(min(owned_bytes))
            owners[id(p)] = rank
            owned_bytes[rank] += p.numel() * p.element_size()
    return owners
    ### END SOLUTION


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1: each rank keeps the optimizer state of its own shard of the parameters only.

    ``ShardedOptimizer(params, optimizer_cls, **kwargs)``: ``params`` as for any optimizer (a list
    of tensors or of param-group dicts; the groups are kept), ``optimizer_cls`` the optimizer to
    shard (``torch.optim.AdamW``), ``kwargs`` its settings (``lr=...``, ``weight_decay=...``).

    After construction: ``self.param_groups`` holds every parameter (the scheduler and
    ``zero_grad`` use it); ``self.owner[id(p)]`` is each parameter's owner rank
    (``assign_owners``); ``self.local_optimizer`` is ``optimizer_cls`` over the parameters this
    rank owns, one group per group of ``self.param_groups`` (a group may be empty), built with
    ``kwargs`` and each group's own settings.

    ``step()`` expects the gradients already averaged over the ranks (Task 2b's all_reduce runs
    before it); see the module docstring for the steps and the cases the checks test.

    ``group`` (keyword only, as Tasks 2b and 5 take one): the process group whose ranks hold the same
    parameters and shard their state (None: every rank). A composed run (Task 14) gives its DP group:
    there the ranks of one data-parallel replica's pipeline stage, TP shard or experts differ from the
    others, and only the DP group's ranks hold the same parameters. ``self.rank`` and
    ``self.world_size`` are then the rank's place in the group and its size (already set for you), the
    owners ``0 .. world_size - 1`` are places in the group, and the broadcast names the owner's
    *global* rank over the group: ``dist.broadcast(p.data, src=_global_rank(self.group, owner),
    group=self.group)`` (``_global_rank`` is given; it is the owner itself when ``group`` is None).
    """

    def __init__(self, params, optimizer_cls, *, group=None, **kwargs):
        self.group = group  # the ranks that share the parameters (None: every rank); see "group" above
        self.rank, self.world_size = _rank_and_world(group)
        super().__init__(params, defaults=dict(kwargs))  # fills self.param_groups, every parameter
        ### BEGIN SOLUTION
        self.owner = assign_owners(self.param_groups, self.world_size)
        local_groups = []
        for group in self.param_groups:
            settings = {k: v for k, v in group.items() if k != "params"}
            mine = [p for p in group["params"] if self.owner[id(p)] == self.rank]
            local_groups.append({**settings, "params": mine})
        self.local_optimizer = optimizer_cls(local_groups, **kwargs)
        ### END SOLUTION

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        """Step the local shard's optimizer, then broadcast every parameter from its owner.

        1. copy each group's settings (the scheduler's ``lr`` among them) from
           ``self.param_groups[i]`` to ``self.local_optimizer.param_groups[i]``;
        2. ``self.local_optimizer.step(**kwargs)`` (parameters whose ``.grad`` is None are
           skipped; ``kwargs`` are whatever the caller gave ``step`` besides the closure, passed
           on as torch's ``ZeroRedundancyOptimizer`` does);
        3. for every parameter, in the same order on every rank:
           ``dist.broadcast(p.data, src=self.owner[id(p)])`` (nothing to send on one rank; with a
           ``group``: ``src=_global_rank(self.group, owner), group=self.group``, class docstring).

        ``closure`` (re-evaluates the loss, as ``torch.optim`` allows) is called once, before the
        step, with gradients enabled; its loss is returned.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        ### BEGIN SOLUTION
        for group, local in zip(self.param_groups, self.local_optimizer.param_groups):
            for key, value in group.items():
                if key != "params":
                    local[key] = value
        self.local_optimizer.step(**kwargs)
        if self.world_size > 1:
            seen = set()
            for group in self.param_groups:
                for p in group["params"]:
                    if id(p) in seen:
                        continue
                    seen.add(id(p))
                    dist.broadcast(p.data, src=_global_rank(self.group, self.owner[id(p)]), group=self.group)
        ### END SOLUTION
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every parameter's gradient (all of them, not only the owned ones: every rank
        computes and averages every gradient)."""
        super().zero_grad(set_to_none=set_to_none)

    # ------------------------------------------------------------------ provided: groups added later
    def add_param_group(self, param_group: dict) -> None:
        """Add a group, as any ``torch.optim.Optimizer`` allows (e.g. to unfreeze a layer during
        training): it joins ``self.param_groups`` and its parameters get owners by the same rule,
        continued after the groups already there (``assign_owners`` over all groups gives the old
        parameters the owners they had), and this rank's owned ones join ``self.local_optimizer``
        as a new group (empty where it owns none). Every rank must add the same group."""
        super().add_param_group(param_group)  # the constructor adds its groups through here too
        if "local_optimizer" not in vars(self):
            return
        self.owner = assign_owners(self.param_groups, self.world_size)
        group = self.param_groups[-1]
        settings = {k: v for k, v in group.items() if k != "params"}
        mine = [p for p in group["params"] if self.owner[id(p)] == self.rank]
        self.local_optimizer.add_param_group({**settings, "params": mine})

    # ------------------------------------------------------------------ provided: saving the state
    # Three forms, for three uses:
    # * state_dict() / load_state_dict(): torch's format over *every* parameter (param_groups list
    #   them all, as a plain optimizer's do), with the state of the parameters this rank owns; after
    #   consolidate_state_dict(to) the rank `to` holds every parameter's state and its state_dict() is
    #   what a plain optimizer of the whole model saves. A plain AdamW loads either; load_state_dict
    #   takes either, keeping only the state of the parameters this rank owns.
    # * consolidate_state_dict(to=0): a collective (every rank calls it), as in torch's
    #   ZeroRedundancyOptimizer: gathers every rank's state onto rank `to`.
    # * sharded_state_dict() / load_sharded_state_dict(): the kit's checkpoints (per rank, keyed by
    #   position, so a run saved on 2 ranks resumes on 4).
    def state_dict(self) -> dict:
        """Torch's optimizer format: every parameter in ``param_groups``, the state of those this
        rank owns (of every parameter on the rank that ``consolidate_state_dict`` gathered to)."""
        held = dict(self.local_optimizer.state)
        held.update(getattr(self, "_consolidated", {}))
        mine, self.state = self.state, held  # torch packs self.state; the wrapper keeps none of its own
        try:
            return super().state_dict()
        finally:
            self.state = mine

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a ``state_dict`` (this class's, consolidated or not, or a plain optimizer's over the
        same param groups): the groups' settings, and the state of the parameters this rank owns."""
        super().load_state_dict(state_dict)  # torch's checks and casts; it fills self.state with every entry
        loaded, self.state = self.state, type(self.state)()
        local = self.local_optimizer
        for group, own in zip(self.param_groups, local.param_groups):
            own.update({k: v for k, v in group.items() if k != "params"})
        local.state.clear()
        for p, entry in loaded.items():
            if self.owner.get(id(p)) == self.rank:
                local.state[p] = entry
        self.__dict__.pop("_consolidated", None)

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's optimizer state onto rank ``to`` (its place in ``self.group``; call it on
        every rank of the group: it is a collective); then ``state_dict()`` there holds every parameter's
        state."""
        index = {id(p): key for key, p in self._positions()}
        mine = {index[id(p)]: {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in entry.items()}
                for p, entry in self.local_optimizer.state.items()}
        if self.world_size > 1:
            gathered = [None] * self.world_size if self.rank == to else None
            dist.gather_object(mine, gathered, dst=_global_rank(self.group, to), group=self.group)
        else:
            gathered = [mine]
        if self.rank != to:
            self.__dict__.pop("_consolidated", None)
            return
        params = dict(self._positions())
        self._consolidated = {params[key]: {k: (v.to(params[key].device) if isinstance(v, torch.Tensor) else v)
                                            for k, v in entry.items()}
                              for part in gathered for key, entry in part.items()}

    def _positions(self):
        """``(key, param)`` for every parameter: ``"<group>.<index>"`` in ``self.param_groups``,
        the same on every rank and at every world size."""
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                yield f"{g}.{i}", p

    def sharded_state_dict(self) -> dict:
        """The kit's checkpoint contract (``student_src/kit/resume/checkpoint.py``): this rank's state
        flat, ``state.<group>.<index>.<name>``, keyed by position, never by rank, so a run saved
        on 2 ranks resumes on 4. Before the first step the entries are created as zeros."""
        try:
            from torch.distributed.checkpoint.state_dict import _init_optim_state  # private torch API
        except ImportError:  # a torch without it: the kit's own (student_src/kit/core/compat.py)
            from student_src.kit.core.compat import init_optim_state as _init_optim_state

        local = self.local_optimizer
        if not local.state and any(p.grad is None for g in local.param_groups for p in g["params"]):
            _init_optim_state(local)  # a zero-gradient step at lr 0: the entries exist, nothing moves
        out = {}
        for key, p in self._positions():
            for name, value in local.state.get(p, {}).items():
                out[f"state.{key}.{name}"] = value
        return out

    def load_sharded_state_dict(self, state: dict) -> None:
        """Put the entries ``sharded_state_dict`` named back into the shard's state."""
        local = self.local_optimizer
        for key, p in self._positions():
            prefix = f"state.{key}."
            entries = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            if entries and self.owner.get(id(p)) == self.rank:
                local.state[p] = {name: (v.clone() if isinstance(v, torch.Tensor) else v) for name, v in entries.items()}

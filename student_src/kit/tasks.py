"""The assignment's tasks, in one table: every other place that needs to know the tasks reads it.

The training loop (which student function syncs gradients), the flags (``--task`` choices and
their messages), the report and plots (order, colours), the export (which task folders), the
notebooks (titles; which tasks a run needs done first), both READMEs (their task table and notebook list,
written by ``python -m autograder.course.readme_tables``) and the grader (which student module a task
grades, which submission folders it is graded from, which collectives a sync may call, what is
extra credit, what the release's TODOs say) all take what they need from ``TASKS`` below.

Adding a task means a row here, its student module (``student_src/<module>.py``), its checks
(``autograder/checks/`` and ``autograder/public/``) and its notebook
(``autograder/course/build_notebooks.py``); ``autograder/README.md`` ("Adding a task") says so.

This file imports nothing but the standard library: the grader loads it by its path
(``autograder/task_table.py``), in its own process and in the sandbox, without importing the
student package.

``sync`` says how the kit's training loop runs a task (``train/task_setup.py``):

* ``None``        not a training task (Task 0's collectives, Task 2's loader, Task 4's counts);
* ``"none"``      one process, no synchronisation (Task 1);
* ``"function"``  the task's first function, ``fn(model)``, is ``train_step``'s
                  ``sync_gradients`` (given a ``comm_log=`` too when it takes one and the
                  student's ``CommLog`` works);
* ``"ddp"``       the task's first function wraps the model, which syncs inside ``backward()``;
                  the kit adds ``--grad_compression``'s hook;
* ``"bucketed"``  the task's first function is a wrapper class taking ``bucket_cap_mb`` and
                  ``compression``; its ``finish_gradient_synchronization`` is the sync.
* ``"sharded_optimizer"``  the task's first function is an optimizer class,
                  ``cls(param_groups, optimizer_cls, **kwargs)`` (a ``torch.optim.Optimizer``), that
                  replaces the kit's AdamW (the scheduler drives it); the gradients are averaged
                  before its step by the sync of the first of ``needs_tasks`` whose kind is
                  ``"function"`` (Task 6: Task 2b's ``allreduce_average``).
* ``"fsdp"``      the task's first function is a wrapper class, ``cls(model)``, that shards the
                  model's parameters; the kit's AdamW is built over the shards it leaves in the
                  model, its ``finish_gradient_synchronization`` then its ``clip_grad_norm_`` (the
                  global norm) are the sync, and every rank evaluates the same number of batches
                  (each forward all_gathers, so the ranks must stay in step).
* ``"pipeline"``  the task's first function is ``pipeline_step`` (``student_src/pipeline.py``): the
                  ranks are ``--pipeline_stages`` P stages x world/P replicas (rank = replica * P +
                  stage), each trains its stage of ``build_stage``; every rank loads the whole batch,
                  takes its replica's rows and cuts them into ``--micro_batches``; with replicas, the
                  first ``"function"`` task of ``needs_tasks`` (2b) averages each stage's gradients on
                  its replica group; the kit clips by the global norm over the stages, steps the
                  stage's AdamW, broadcasts the last stage's loss, and gathers the stages' weights on
                  every rank before evaluating. Its ``memory`` is ``"pipeline"``: a rank holds its stage's
                  parameters, gradients and AdamW state, and the activations of the micro-batches its
                  schedule keeps (``parallel/pipeline/memory.py``). It has no gradient ``traffic``
                  pattern: its setup names the step's sends (``parallel/pipeline/traffic.py``).
* ``"tensor_parallel"``  the task's first function is ``parallelize_bert_layer``: the ranks are
                  ``--tp_size`` T ranks per TP group x world/T replicas (rank = replica * T + tp_rank);
                  a copy of the model, each encoder layer rewritten by it on the TP group, trains on
                  its replica's share of the batch (the student's loader over the replicas); with
                  replicas, the first ``"function"`` task of ``needs_tasks`` (2b) averages every
                  gradient on the DP group; the kit clips by the global norm (the shards' squares
                  summed over the TP group) and refills the whole model from the shards before
                  evaluating (``parallel/tensor/``).
* ``"context_parallel"``  the task's first function is ``parallelize_bert_for_context``: the ranks are
                  ``--cp_size`` C ranks per CP group x world/C replicas (rank = replica * C + cp_rank); a
                  copy of the model, rewritten by it on the CP group (``--cp_attention`` allgather, ring or ulysses),
                  trains on its replica's share of the batch, each CP rank on 1/C of every sequence; the
                  student's ``sync_context_parallel_grads`` sums the gradients over the CP group, then with
                  replicas the first ``"function"`` task of ``needs_tasks`` (2b) averages them on the DP
                  group; the copy trains the whole model's own parameters, which evaluation and checkpoints
                  use as they are (``parallel/context/``).
* ``"expert_parallel"``  the task's first function is ``parallelize_moe_layer``: the model is a MoE BERT
                  (``core/moe.py``: ``tiny-moe``, ``minilm-moe``); the ranks are ``--ep_size`` P ranks per EP
                  group x world/P replicas (rank = replica * P + ep_rank); a copy of the model, each MoE
                  layer cut by it on the EP group (E/P experts a rank), trains on every rank's own share
                  of the batch; ``sync_expert_parallel_grads`` averages the experts over the DP group and the
                  rest over all ranks with the first ``"function"`` task of ``needs_tasks`` (2b); the kit
                  gathers the experts into the whole model before evaluating (``parallel/expert/``).
* ``"composed"``  the parallelisms composed on one grid (Task 14): the degrees from ``--pipeline_stages``,
                  ``--tp_size``, ``--cp_size``, ``--ep_size`` (dp what they leave), the kit's mesh
                  (``parallel/mesh.py``) checks them; the student's ``build_axis_groups`` builds every axis's
                  groups and ``sync_composed_grads`` syncs the gradients; the kit cuts the model with the
                  student's Tasks 10-12 and, with stages, runs the pipeline step of Task 9 around it, clips by
                  the global norm over every axis, and refills the whole model before evaluating
                  (``parallel/composed.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: the ``sync`` kinds that wrap the model (``--grad_compression`` applies to them)
WRAPPERS = ("ddp", "bucketed")
#: every ``sync`` kind the training loop knows (module docstring; ``train/task_setup.py``)
SYNC_KINDS = ("none", "function", *WRAPPERS, "sharded_optimizer", "fsdp", "pipeline", "tensor_parallel",
              "context_parallel", "expert_parallel", "composed")
#: the collectives gloo carries on CUDA tensors (PyTorch's backend table); a task that calls only these
#: keeps its model on a GPU that several local ranks share (``ranks/device_choice.py``)
GLOO_CUDA_COLLECTIVES = frozenset({"all_reduce", "broadcast", "barrier"})
#: the collectives of the ``sync`` kinds whose row leaves ``collectives`` open: DDP and the bucketed
#: wrapper broadcast the parameters once and all_reduce the gradients; one process calls none
_SYNC_COLLECTIVES = {"none": frozenset(), "ddp": frozenset({"broadcast", "all_reduce"}),
                     "bucketed": frozenset({"broadcast", "all_reduce"})}
#: the colour of a task without one of its own (plots)
DEFAULT_COLOR = "#888888"


@dataclass(frozen=True)
class Task:
    """One row of the table (see the module docstring)."""

    id: str                          # "2a": what --task, the checks, points.toml and the notebooks say
    title: str                       # short: tables, the run's first log line, notebook headers
    module: str                      # student_src/<module>.py, the file the student edits for it
    functions: tuple[str, ...]       # the student functions (or classes) of this task, the kit's first
    notebook: str                    # notebooks/<notebook>.ipynb that teaches and checks it
    color: str = DEFAULT_COLOR       # its colour in plots
    sync: str | None = None          # how the training loop runs it (module docstring); None: no training run
    collectives: frozenset[str] | None = None  # the torch.distributed collectives its code may call (None: any)
    must_call: frozenset[str] = frozenset()    # ... and those it must call
    extra_credit: bool = False       # adds to the score, not to the maximum (points.toml may override)
    export: bool = False             # a task<id>/ folder in `python -m student_src.export`
    graded_from: tuple[str, ...] = ()  # submission folders it is graded from, best first (then the top level)
    single_node_equivalence: bool = False  # grading compares its losses with a single-node run (tiny BERT)
    more_modules: tuple[str, ...] = ()  # more student files of the task (an advanced part too long for one
                                        # file), with no import cycle between them and its module; the
                                        # release, the export and the grader treat them as its module
    checks_build_bert: bool = False  # its other checks build BERT layers too: the grader's sandbox imports
                                     # transformers once, before it forks ranks, for this task as for the above
                                     # (without it each rank of such a check imports it: seconds a check)
    traffic: str | None = None       # how a step's gradients travel (traffic_model.py): "gather_scatter"
                                     # through rank 0, "ring" (an all_reduce per tensor), "ring_buckets"
                                     # (one per bucket), "ring_broadcast" (ring all_reduces, then every parameter
                                     # broadcast from its owner: ZeRO-1), "fsdp" (all_gathers and reduce_scatters
                                     # per sharded parameter, traffic_model.fsdp_calls); None: no gradient traffic
    memory: str | None = None        # what a rank holds (memory_model.py): "replicated" (every rank the whole
                                     # model, gradients and optimizer state), "zero1" (optimizer state sharded),
                                     # "zero2" (and gradients), "fsdp" (and parameters), "tensor_parallel" (1/T of
                                     # every cut weight, the rest whole); ":flat" or ":greedy" after it says how
                                     # shards are cut (default greedy whole tensors for ZeRO, flat per unit for
                                     # FSDP); None: not a training task
    built: str = ""                  # what the student builds, in one line of markdown: the READMEs' task table
                                     # (``python -m autograder.course.readme_tables`` writes it; empty: the title)
    advanced: bool = False           # said beside its id in the READMEs' task table
    needs_tasks: tuple[str, ...] = ()  # the other tasks whose student code its run calls (train_step, the loader):
                                       # a notebook's run cell checks them, and its own, for TODOs before it starts
                                       # ranks (Task 0's init_distributed has a kit fallback: no run needs it); for a
                                       # task that does not train, the tasks its notebook runs (4: 2b's, 8: 3's). A
                                       # course that sets a task sets these too (`autograder release --tasks`)
    runs_as: str = ""                # a task that does not train (``sync`` None): how its work is run instead, the
                                     # answer to ``run_glue --task <id>`` (``not_a_run``)

    @property
    def trains(self) -> bool:
        """``run_glue --task`` accepts it."""
        return self.sync is not None

    @property
    def distributed(self) -> bool:
        """It trains on several ranks."""
        return self.sync not in (None, "none")

    @property
    def calls(self) -> frozenset[str] | None:
        """The collectives its run calls: its own and those of the tasks it needs (None: unknown)."""
        own = self.collectives if self.collectives is not None else _SYNC_COLLECTIVES.get(self.sync)
        if own is None:
            return None
        for other in self.needs_tasks:
            if self.sync == "composed" and TASKS[other].distributed:
                # a composed run trains the other parallelisms' layers as well: every collective they call
                theirs = TASKS[other].calls
                if theirs is None:
                    return None
                own = own | theirs
                continue
            theirs = TASKS[other].collectives
            if TASKS[other].sync == "function" and theirs is not None:
                own = own | theirs
        return own

    @property
    def gloo_cpu_only(self) -> frozenset[str]:
        """Its collectives that gloo carries on CPU tensors only (``{"any"}`` where they are unknown)."""
        return frozenset({"any"}) if self.calls is None else self.calls - GLOO_CUDA_COLLECTIVES

    @property
    def gloo_cuda(self) -> bool:
        """Its run works with gloo on CUDA tensors (several local ranks sharing a GPU)."""
        return not self.gloo_cpu_only

    @property
    def folders(self) -> tuple[str, ...]:
        return self.graded_from or (f"task{self.id}",)


_ROWS = (
    Task("0", "process group and warm-up collectives", "collectives",
         ("init_distributed", "ring_pass", "broadcast_from_root", "all_reduce_sum", "gather_to_root", "scatter_from_root"),
         "0_collectives", graded_from=("task0", "task1", "task2a", "task2b", "task3"),
         runs_as=("its collectives run on local ranks in notebook 0_collectives and in its checks (make test in "
                  "the students' repository)"),
         built="set up the process group; warm-up collectives (ring send/recv, broadcast, all_reduce, gather/scatter)"),
    Task("1", "single node", "train", ("train_step",), "1_single_node", color="#444444", sync="none", export=True,
         memory="replicated",
         built="one training step (forward, backward, clip, step)"),
    Task("2", "non-overlapping data shards", "partition", ("build_train_loader",), "2a_gather_scatter",
         graded_from=("task2", "task2a", "task2b", "task3"),
         runs_as="its loader feeds every data-parallel run, e.g. `--task 2b --world_size 2 --spawn`",
         built="non-overlapping data shards"),
    Task("2a", "gather/scatter", "sync", ("gather_scatter_average",), "2a_gather_scatter", color="#1f77b4",
         sync="function", collectives=frozenset({"gather", "scatter", "barrier"}), must_call=frozenset({"gather", "scatter"}),
         export=True, single_node_equivalence=True, traffic="gather_scatter", memory="replicated",
         needs_tasks=("1", "2"),
         built="gradient averaging through rank 0 (`gather` / `scatter`)"),
    Task("2b", "all_reduce", "sync", ("allreduce_average",), "2b_allreduce", color="#2ca02c",
         sync="function", collectives=frozenset({"all_reduce", "barrier"}), must_call=frozenset({"all_reduce"}),
         export=True, single_node_equivalence=True, traffic="ring", memory="replicated", needs_tasks=("1", "2"),
         built="gradient averaging with `all_reduce`"),
    Task("3", "DistributedDataParallel", "ddp", ("wrap_ddp",), "3_ddp", color="#d62728", sync="ddp", export=True,
         single_node_equivalence=True, traffic="ring_buckets", memory="replicated", needs_tasks=("1", "2"),
         built="`DistributedDataParallel`"),
    Task("4", "traffic: what is communicated, and how many bytes", "profiling",
         ("tensor_nbytes", "expected_allreduce_bytes", "CommLog"), "4_traffic", graded_from=("task4", "task2b"),
         needs_tasks=("1", "2", "2b"),
         runs_as="it measures a data-parallel run: add --measure_traffic, e.g. `--task 2b --world_size 2 --spawn "
                 "--measure_traffic`",
         built="predict the bytes of every all_reduce; compare with the NIC"),
    Task("5", "bucketed overlap (advanced)", "bucketed", ("BucketedDDP", "assign_buckets"), "5_bucketed",
         color="#9467bd", sync="bucketed", extra_credit=True, traffic="ring_buckets", memory="replicated",
         needs_tasks=("1", "2"),
         built="bucketed gradient sync that overlaps with backward", advanced=True),
    # Task 6 is extra credit for now, for the reason Task 8 is (it arrived mid-term: required, it would raise the
    # maximum under students who had finished); points.toml's [tasks] extra_credit makes it required for a new course.
    Task("6", "sharded optimizer state (ZeRO-1)", "sharded_optimizer", ("ShardedOptimizer", "assign_owners"),
         "6_sharded_optimizer", color="#17becf", sync="sharded_optimizer",
         collectives=frozenset({"broadcast", "barrier"}), must_call=frozenset({"broadcast"}), extra_credit=True,
         export=True, single_node_equivalence=True, traffic="ring_broadcast", memory="zero1",
         needs_tasks=("1", "2", "2b"),
         built="shard AdamW's state across ranks (ZeRO-1): each rank steps its own parameters and broadcasts them"),
    # Task 7 is advanced, extra credit like Task 5. Its wrapper calls the module-level all_gather_single /
    # reduce_scatter_single of fsdp.py, which reach torch's all_gather_into_tensor / reduce_scatter_tensor (the spy
    # files every name a torch version uses for them under these two).
    Task("7", "fully sharded data parallel (FSDP)", "fsdp", ("FSDP",), "7_fsdp", color="#e377c2", sync="fsdp",
         collectives=frozenset({"all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "barrier"}),
         must_call=frozenset({"all_gather_into_tensor", "reduce_scatter_tensor"}), extra_credit=True, export=True,
         single_node_equivalence=True, traffic="fsdp", memory="fsdp", needs_tasks=("1", "2"),
         built=("fully sharded data parallel (FSDP) by hand: each rank keeps 1/N of every weight, gathers a "
                "layer's weights for its forward and backward, reduce-scatters the gradients"), advanced=True),
    # Task 8 is extra credit because it arrived mid-term: required, it would change the maximum under students who
    # had finished. Not a training task of its own (sync None, no export folder): the kit's checkpoints call its
    # two functions in every training task's run (kit/resume/checkpoint.py).
    Task("8", "training that survives a lost node: what to save", "resume",
         ("capture_training_state", "restore_training_state"), "8_fault_tolerance", color="#8c564b",
         extra_credit=True, graded_from=("task8", "task3", "task2b", "task2a", "task1"), needs_tasks=("1", "2", "3"),
         runs_as=("its functions save and restore every training run: add --save_every N, then run again with "
                  "--resume auto, e.g. `--task 3 --world_size 2 --spawn --save_every 10 --output_dir runs/task3`"),
         built="what a checkpoint must hold for an exact resume after a lost node"),
    # Task 9 is advanced, extra credit like Task 7. Its stages talk point to point only; its notebook also runs the
    # student's pipeline_step on local ranks itself, timed (kit/demo/pipeline.py).
    Task("9", "pipeline parallelism (GPipe, 1F1B)", "pipeline",
         ("pipeline_step", "schedule_order", "stage_sizes", "build_stage", "interleaved_order", "backward_input",
          "backward_weight"), "9_pipeline", color="#bcbd22",
         sync="pipeline", collectives=frozenset({"send", "recv", "isend", "irecv", "barrier"}), extra_credit=True,
         export=True, memory="pipeline", needs_tasks=("2b",), checks_build_bert=True,
         built=("pipeline parallelism by hand: the model cut into stages, micro-batches through them with `send` "
                "/ `recv`, the GPipe (AFAB) and 1F1B schedules, the bubble measured"), advanced=True),
    # Task 10 is advanced, extra credit like Tasks 7 and 9. Every collective of the student's code is an all_reduce
    # over the TP group (f's backward, g's forward); TP x DP averages over the replicas with Task 2b's function.
    # Sequence parallelism (--sequence_parallel) adds all_gathers and reduce_scatters along the sequence (either form).
    Task("10", "tensor parallelism (Megatron's f and g)", "tensor_parallel",
         ("parallelize_bert_layer", "F", "G", "ColumnParallelLinear", "RowParallelLinear", "mesh_ranks"),
         "10_tensor_parallel",
         color="#ff7f0e", sync="tensor_parallel",
         collectives=frozenset({"all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                                "reduce_scatter_tensor"}),
         must_call=frozenset({"all_reduce"}), extra_credit=True, export=True, memory="tensor_parallel",
         needs_tasks=("1", "2", "2b"), checks_build_bert=True,
         more_modules=("tensor_parallel_sequence", "tensor_parallel_vocab"),  # --sequence_parallel, --vocab_parallel
         built=("tensor parallelism by hand: Megatron's f and g as autograd functions, column- and row-parallel "
                "Linear layers, every BERT encoder layer cut by heads and MLP width, the 2-D mesh of TP groups "
                "and replicas (`--tp_size`; TP x DP with your 2b on the replicas); sequence parallelism "
                "(`--sequence_parallel`: all_gather / reduce_scatter along the sequence, the LayerNorms on 1/T "
                "of it); the vocabulary-parallel embedding (`--vocab_parallel`: the word-embedding table cut by "
                "rows)"), advanced=True),
    # Task 11 is advanced, extra credit like Tasks 7, 9 and 10. All-gather attention calls all_gather forward and
    # reduce_scatter backward, ring attention isend/irecv; the logits of CP rank 0 are broadcast, the gradients summed
    # with all_reduce; CP x DP averages over the replicas with Task 2b's function. A CP rank holds the whole model.
    # The attentions (AllGatherAttention, RingAttention) are in more_modules' context_parallel_attn.py; Ulysses
    # (extra credit inside the task: all_to_all_single to head-sharded Q, K, V and back) in context_parallel_ulysses.py.
    Task("11", "context parallelism (all-gather and ring attention)", "context_parallel",
         ("parallelize_bert_for_context", "shard_inputs", "FirstRankLogits", "sync_context_parallel_grads"),
         "11_context_parallel", color="#7f7f00", sync="context_parallel",
         collectives=frozenset({"all_gather", "reduce_scatter", "isend", "irecv", "broadcast", "all_reduce",
                                "all_to_all_single"}),
         must_call=frozenset({"all_reduce", "broadcast"}), extra_credit=True, export=True, memory="replicated",
         needs_tasks=("1", "2", "2b"), checks_build_bert=True,
         more_modules=("context_parallel_attn", "context_parallel_ulysses"),
         built=("context parallelism by hand: each rank holds 1/C of every sequence (global position ids), "
                "attention by all-gather (all_gather K and V, reduce_scatter dK and dV) and by a ring "
                "(isend/irecv of K/V blocks with an online softmax, dK/dV sent home), both autograd functions "
                "with hand-written backwards, and DeepSpeed-Ulysses (all_to_all_single to head-sharded Q, K, V and "
                "back, the reverse all-to-alls as the backward); CP rank 0's logits on every rank; CP x DP with your "
                "2b on the replicas (`--cp_size`, `--cp_attention allgather\\|ring\\|ulysses`)"), advanced=True),
    # Task 12 is advanced, extra credit like Tasks 7, 9 and 10. Its layers call all_to_all_single only (the counts,
    # the tokens there and back); EP x DP averages with Task 2b's function on the DP group and on all ranks.
    Task("12", "expert parallelism (mixture of experts, all-to-all)", "expert_parallel",
         ("parallelize_moe_layer", "expert_parallel_experts", "exchange_counts", "AllToAll", "expert_mesh",
          "sync_expert_parallel_grads"),
         "12_expert_parallel", color="#7f7f7f", sync="expert_parallel",
         collectives=frozenset({"all_to_all_single"}), must_call=frozenset({"all_to_all_single"}), extra_credit=True,
         export=True, memory="expert_parallel", needs_tasks=("1", "2", "2b"), checks_build_bert=True,
         built=("expert parallelism by hand: a mixture-of-experts BERT (`tiny-moe`, `minilm-moe`: every MLP "
                "turned into E experts and a top-k router, a capacity factor, the Switch load-balancing loss), "
                "the experts spread over an EP group, each rank's tokens sent to their experts and back with "
                "`all_to_all_single` and uneven splits (the counts first), the reverse all-to-all as the "
                "backward you write; EP x DP (`--ep_size`; experts averaged over their replicas, the rest over "
                "all ranks, with your 2b)"), advanced=True),
    # Task 13 is extra credit, like the advanced tasks. Not a training task of its own (sync None, like Task 8): every
    # task whose whole model is on each rank calls its functions when a run asks, --gradient_accumulation_steps K
    # (accumulation_step in place of train_step: the sync once per optimizer step) and --recompute (apply_recompute
    # rewrites the encoder before the task wraps it; RecomputeFunction is what it applies).
    Task("13", "memory levers: gradient accumulation and activation recomputation", "recompute",
         ("accumulation_step", "RecomputeFunction", "apply_recompute"), "13_memory_levers", color="#aec7e8",
         extra_credit=True, needs_tasks=("1", "2"), checks_build_bert=True,
         runs_as=("its two levers are flags of the training tasks, --gradient_accumulation_steps K and --recompute "
                  "full|every:k|selective (`--help` says which tasks take each), e.g. `--task 3 --world_size 2 "
                  "--spawn --gradient_accumulation_steps 4 --recompute full`"),
         built=("the two memory levers: gradient accumulation (`--gradient_accumulation_steps K`, Hugging Face's "
                "meaning: your `accumulation_step` syncs once per optimizer step, every backward but the last under "
                "`no_sync`) and activation recomputation (`--recompute full\\|every:k\\|selective`: your "
                "`RecomputeFunction` keeps a block's input and the RNG state, reruns it in backward with the same "
                "dropout masks; `--torch_recompute`: torch's checkpoint)"), advanced=True),
    # Task 14 is advanced, extra credit like Tasks 9-12: the parallelisms composed on one N-D grid (the layout, every
    # axis's groups, the data shards, the composed sync through the student's own Tasks 2b, 10, 11 and 12). Its sync
    # calls all_reduce only (2b's average, 10's and 11's sums). Its run (sync "composed": parallel/composed.py, on the
    # kit's mesh, parallel/mesh.py) also trains with the student's Tasks 1, 2 and 9-12 (train_step, the loader, the
    # pipeline's step, the TP/CP/EP layers), so it needs them and calls their collectives too (``calls``).
    Task("14", "the parallelisms composed (N-D parallelism)", "parallel_dims",
         ("coords_to_rank", "rank_to_coords", "axis_ranks", "build_axis_groups", "data_shard", "loss_rank",
          "sync_composed_grads"),
         "14_parallel_dims", color="#98df8a", collectives=frozenset({"all_reduce"}), extra_credit=True, sync="composed",
         needs_tasks=("1", "2", "2b", "6", "7", "9", "10", "11", "12"), checks_build_bert=True,
         built=("the parallelisms composed on one N-D grid: coordinates <-> rank in one order (TP innermost), "
                "every axis's process groups created by every rank in the same order, which ranks share a data "
                "shard, which rank reads the loss, and the composed gradient sync (DP average, CP sum, TP's "
                "replicated parameters, experts over their replicas) through your own Tasks 2b, 10, 11 and 12"), advanced=True),
)

#: every task by id, in the assignment's order
TASKS: dict[str, Task] = {t.id: t for t in _ROWS}


def get(task_id) -> Task:
    """The row of ``task_id`` ("2a", 2 and "task2a" work too); a clear error for anything else."""
    key = str(task_id).strip().lower().removeprefix("task")
    if key not in TASKS:
        raise ValueError(f"unknown task {task_id!r}; choose one of {', '.join(TASKS)}")
    return TASKS[key]


def not_a_run(task_id) -> str | None:
    """What ``run_glue --task <task_id>`` says for a task of the table that does not train (None for one that
    does, or an id that is not in the table): the task and how its work is run instead."""
    task = TASKS.get(str(task_id).strip().lower().removeprefix("task"))
    if task is None or task.trains:
        return None
    return f"Task {task.id} ({task.title}) is not a run of its own: {task.runs_as or 'see its notebook, ' + task.notebook}"


def ids(where=None) -> list[str]:
    """The task ids in order; ``where(task)`` keeps only some (``ids(lambda t: t.trains)``)."""
    return [t.id for t in TASKS.values() if where is None or where(t)]


def order(task_id) -> int:
    """Sort key: a task's place in the assignment (unknown ids last)."""
    key = str(task_id)
    return list(TASKS).index(key) if key in TASKS else len(TASKS)


def for_module(module: str) -> list[Task]:
    """The tasks graded from ``student_src/<module>.py`` (two for ``sync``; its task for a ``more_modules`` file)."""
    return [t for t in TASKS.values() if t.module == module or module in t.more_modules]


def for_notebook(stem: str) -> list[Task]:
    """The tasks a notebook (``2a_gather_scatter``) teaches."""
    return [t for t in TASKS.values() if t.notebook == stem]


def reference() -> str:
    """The single-node training task every multi-rank run is compared with, step by step (the
    training task without a gradient sync: Task 1)."""
    return ids(lambda t: t.sync == "none")[0]


def for_function(name: str) -> Task:
    """The task whose student module provides the function (or class) ``name``."""
    for t in TASKS.values():
        if name in t.functions:
            return t
    raise ValueError(f"no task of the table names the student function {name!r}")


def modules() -> list[str]:
    """Every student module, once, in task order (a task's ``more_modules`` after its module)."""
    return list(dict.fromkeys(m for t in TASKS.values() for m in (t.module, *t.more_modules)))


def spoken(task_ids) -> str:
    """``["2a", "2b", "3", "5"]`` -> ``"2a, 2b, 3 or 5"`` (for messages)."""
    task_ids = list(task_ids)
    return task_ids[0] if len(task_ids) == 1 else ", ".join(task_ids[:-1]) + " or " + task_ids[-1]

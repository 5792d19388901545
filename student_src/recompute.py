"""Task 13 (extra credit): the two memory levers every trainer has, by hand.

Gradient accumulation
---------------------
A batch too large for memory is cut into K **micro-batches**: forward and backward each one, let
their gradients add up in ``.grad``, and step the optimizer once. With each micro-batch's loss
divided by K (they are means over equal micro-batches), the summed gradient *is* the gradient of
the whole batch's mean loss: the run equals one with a K x larger batch (Hugging Face's
``gradient_accumulation_steps``; ``run_glue --gradient_accumulation_steps K``).

In a data-parallel run only the *sum* matters, so the gradients need syncing once, after the last
micro-batch: syncing after every one sends K times the bytes for the same result. The rule you
write (``accumulation_step``): call ``sync_gradients`` once, after the last backward; and run every
backward but the last under ``no_sync()`` when the kit gives one (a wrapper that syncs *inside*
backward: DDP's ``no_sync``, Task 5's ``BucketedDDP.no_sync``), so those backwards send nothing.

Activation recomputation (checkpointing)
----------------------------------------
Backward needs what forward computed: autograd keeps, per BERT layer, a dozen tensors of
``batch x seq x hidden`` and the attention's ``batch x heads x seq x seq`` scores, probabilities
and dropout mask. **Recomputation** trades compute for that memory: run a block *without* keeping
its activations, keep only its inputs, and in backward run the block's forward again (this time
recording the graph) and backpropagate through it. Full recomputation costs about one more forward.

Dropout makes the rerun delicate: it must draw the *same* masks. ``RecomputeFunction`` saves the
random generators' states (the CPU's and, for inputs on a GPU, that GPU's) before its forward and
restores them around the rerun, without disturbing the generators of the rest of the run
(``torch.random.fork_rng``). Which blocks (``apply_recompute``):

* ``"full"``: every encoder layer (the memory of a layer: its input only);
* ``"every:k"``: every k-th layer (0, k, 2k, ...): the others keep their activations. With N
  layers, recomputing all but every sqrt(N)-th keeps sqrt(N) checkpoints (Chen et al., 2016);
* ``"selective"``: only the attention core of every layer (scores, softmax, attention dropout,
  probabilities times values): the s x s tensors, the largest per token at long sequences, for a
  few percent of the compute (Korthikanti et al., 2022; Megatron's "selective").

``torch.utils.checkpoint.checkpoint`` is the same idea, done by torch (``--torch_recompute``).

Cases the checks test
---------------------
* ``accumulation_step``: the loss returned and the weights after it equal one ``train_step`` on the
  K micro-batches concatenated (fp32, no dropout); ``sync_gradients`` called exactly once per
  optimizer step, after the last backward; ``no_sync`` entered for every micro-batch but the last;
  no gradient left in ``.grad`` afterwards; K = 1 is a plain step;
* ``RecomputeFunction`` on one BERT layer with dropout 0.1: the output and the gradients of its
  input and parameters equal the layer's own (the same dropout masks), and what autograd keeps for
  backward is the input only (hooks count the saved tensors), not the layer's activations;
* ``apply_recompute(model, "every:2")`` and ``"selective"`` on a tiny BERT: the same gradients as
  without, with dropout on; fewer saved bytes; an unknown mode: ``ValueError`` in one line.
"""

import contextlib

import torch
from torch import nn


# ----------------------------------------------------------------------------- accumulation
def accumulation_step(model, micro_batches, optimizer, scheduler=None, sync_gradients=None, max_grad_norm=1.0,
                      no_sync=None):
    """One optimizer step over ``micro_batches`` (a list of K batches); return the detached mean loss.

    Args:
        model, optimizer, scheduler, sync_gradients, max_grad_norm: as Task 1's ``train_step``.
        micro_batches: K dicts of tensors, each one forward's batch (``model(**batch).loss`` is its
            mean loss); equal sizes.
        no_sync: ``None``, or a function returning a context manager inside which a backward sends
            no gradients (``model.no_sync`` of DDP or Task 5's ``BucketedDDP``).

    The rule:
        1. For each micro-batch: forward, then ``(loss / K).backward()``; every backward but the
           last inside ``no_sync()`` when it is given.
        2. After the last backward only: ``sync_gradients(model)`` if given (once per call).
        3. Clip, ``optimizer.step()``, ``scheduler.step()`` if given, ``zero_grad(set_to_none=True)``.
        4. Return the mean of the K losses (not divided by K again), detached, 0-dim.

    Hint: about fifteen lines; ``contextlib.nullcontext()`` stands in for ``no_sync()`` on the last.
    """
    ### BEGIN SOLUTION
    k = len(micro_batches)
    if k < 1:
        raise ValueError("accumulation_step needs at least one micro-batch")
    total = None
    for i, batch in enumerate(micro_batches):
        last = i == k - 1
        with (no_sync() if no_sync is not None and not last else contextlib.nullcontext()):
            loss = model(**batch).loss
            (loss / k).backward()
        total = loss.detach() if total is None else total + loss.detach()
    if sync_gradients is not None:
        sync_gradients(model)
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return total / k
    ### END SOLUTION


# ----------------------------------------------------------------------------- recomputation
def rng_devices(tensors) -> list:
    """The CUDA devices of ``tensors`` (provided): whose generators a recomputation saves and restores."""
    return sorted({t.device.index for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda})


class RecomputeFunction(torch.autograd.Function):
    """``RecomputeFunction.apply(run, *inputs)``: ``run(*inputs)`` without keeping its activations.

    ``run`` returns one tensor (a BERT layer's hidden states). ``inputs`` are tensors (at least one
    requires grad, or nothing flows back); ``run``'s other arguments are closed over by ``run``.

    forward(ctx, run, *inputs):
        * keep ``run`` on ``ctx``; save the CPU generator's state (``torch.get_rng_state()``) and, for
          the CUDA devices of the inputs (``rng_devices``), each one's ``torch.cuda.get_rng_state(d)``;
        * save **only the inputs** (``ctx.save_for_backward(*inputs)``), never ``run``'s output or
          anything inside it;
        * return ``run(*inputs)`` (autograd records nothing inside a Function's forward).

    backward(ctx, grad_output):
        * take the saved inputs, each **detached** and set to require grad as the original did (the
          rerun's graph must start here, not reach back into the forward's graph);
        * inside ``torch.random.fork_rng(devices=...)`` (the run's generators come back untouched
          afterwards), restore the saved states, then rerun ``run`` **with grad enabled**
          (``torch.enable_grad()``: backward runs without it);
        * ``torch.autograd.backward(output, grad_output)``: the block's parameters get their
          gradients here;
        * return ``None`` for ``run`` and each input's ``.grad`` (None where it needs none).
    """

    @staticmethod
    def forward(ctx, run, *inputs):
        ### BEGIN SOLUTION
        ctx.run = run
        ctx.devices = rng_devices(inputs)
        ctx.cpu_state = torch.get_rng_state()
        ctx.cuda_states = [torch.cuda.get_rng_state(d) for d in ctx.devices]
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return run(*inputs)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        ### BEGIN SOLUTION
        inputs = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
        with torch.random.fork_rng(devices=ctx.devices):
            torch.set_rng_state(ctx.cpu_state)
            for d, state in zip(ctx.devices, ctx.cuda_states):
                torch.cuda.set_rng_state(state, d)
            with torch.enable_grad():
                output = ctx.run(*inputs)
        torch.autograd.backward(output, grad_output)
        return (None, *(x.grad if x.requires_grad else None for x in inputs))
        ### END SOLUTION


def recompute(run, *inputs):
    """``run(*inputs)`` through ``RecomputeFunction`` (provided): what the wrappers below call."""
    return RecomputeFunction.apply(run, *inputs)


class RecomputedLayer(nn.Module):
    """A BERT encoder layer run through ``recompute`` (provided): the same parameters under
    ``self.layer`` (checkpoints and optimizers see them as ``...layer.N.layer.<name>``). Its other
    arguments (the attention mask, keywords) are closed over; in eval mode, or with nothing that
    requires grad, it runs the layer directly (nothing to save)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states, *args, **kwargs):
        if not (torch.is_grad_enabled() and hidden_states.requires_grad):
            return self.layer(hidden_states, *args, **kwargs)

        def run(h):
            return self.layer(h, *args, **kwargs)

        return recompute(run, hidden_states)


def attention_core(q, k, v, mask, dropout: float, training: bool):
    """Scores, softmax, dropout, probabilities times values (provided): BERT's eager attention.
    ``q, k, v``: ``[batch, heads, s, d]``; ``mask``: None, bool (True: attend) or additive.
    Returns ``[batch, s, heads, d]``."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else scores + mask
    probs = nn.functional.dropout(torch.softmax(scores, dim=-1), p=dropout, training=training)
    return torch.matmul(probs, v).transpose(1, 2).contiguous()


class SelectiveSelfAttention(nn.Module):
    """A BERT self-attention whose core (``attention_core``) is recomputed, its Linears kept (provided):
    the same ``query``, ``key``, ``value`` (the same parameters, the same names) and dropout
    probability. Returns ``(output, None)`` as ``BertSelfAttention`` does."""

    def __init__(self, attn: nn.Module):
        super().__init__()
        self.query, self.key, self.value = attn.query, attn.key, attn.value
        self.num_attention_heads, self.attention_head_size = attn.num_attention_heads, attn.attention_head_size
        self.dropout_p = attn.dropout.p if isinstance(getattr(attn, "dropout", None), nn.Dropout) else 0.0

    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        b, s = hidden_states.shape[:2]
        split = lambda x: x.view(b, s, self.num_attention_heads, self.attention_head_size).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.query(hidden_states)), split(self.key(hidden_states)), split(self.value(hidden_states))
        p, training = self.dropout_p, self.training

        def core(q, k, v):
            return attention_core(q, k, v, attention_mask, p, training)

        recording = torch.is_grad_enabled() and q.requires_grad
        out = recompute(core, q, k, v) if recording else core(q, k, v)
        return out.reshape(b, s, -1), None


MODES = ("full", "every:k", "selective")


def parse_mode(mode: str) -> tuple[str, int]:
    """``"full"`` -> ``("full", 1)``, ``"every:3"`` -> ``("every", 3)``, ``"selective"`` -> ``("selective", 0)``
    (provided); anything else: ``ValueError`` in one line."""
    if mode == "full":
        return "full", 1
    if mode == "selective":
        return "selective", 0
    if isinstance(mode, str) and mode.startswith("every:") and mode[6:].isdigit() and int(mode[6:]) >= 1:
        return "every", int(mode[6:])
    raise ValueError(f"unknown recompute mode {mode!r}; choose full, every:k (k >= 1) or selective")


def apply_recompute(model: nn.Module, mode: str) -> nn.Module:
    """Rewrite a Hugging Face BERT (``model.bert.encoder.layer``, or ``model.encoder.layer``) in place
    to recompute in backward; return the model.

    * ``"full"``: every encoder layer becomes ``RecomputedLayer(layer)``;
    * ``"every:k"``: layers 0, k, 2k, ... do (``"every:1"`` is ``"full"``);
    * ``"selective"``: every layer's ``attention.self`` becomes ``SelectiveSelfAttention(it)``.

    ``mode`` is parsed by ``parse_mode`` (a bad one: its ``ValueError``, before anything changes).
    """
    ### BEGIN SOLUTION
    kind, k = parse_mode(mode)
    layers = getattr(model, "base_model", model).encoder.layer
    for i in range(len(layers)):
        if kind == "selective":
            layers[i].attention.self = SelectiveSelfAttention(layers[i].attention.self)
        elif i % k == 0:
            layers[i] = RecomputedLayer(layers[i])
    return model
    ### END SOLUTION

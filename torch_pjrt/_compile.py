"""torch.compile(model, backend="tpu"): whole graphs as one StableHLO program.

Dynamo captures the Python code, AOTAutograd produces forward and backward
graphs of ATen ops (functionalized; decomposed to the ops we lower), and each
graph becomes one program built node by node with the same C lowering rules as
eager mode ("tp::graph" in the C core).  A graph with an op we cannot lower
(a user's custom op, a while_loop) is cut there: that op runs eagerly between
the programs of the ops around it, with a warning naming the op, so compiling
never makes a model stop working.
"""
import contextlib
import copy
import functools
import math
import operator
import threading
import warnings

import sys

import torch

from . import load_error as _load_error

if _load_error is not None:  # torch.compile(backend="tpu") found the entry point; the device did not open
    raise RuntimeError(f'torch.compile(backend="tpu"): the tpu device is not available. {_load_error}')

from torch._functorch._aot_autograd.descriptors import SavedForBackwardsAOTOutput
from torch._prims import rng_prims as _rng_prims
from torch.multiprocessing.reductions import StorageWeakRef

from . import _C, _attention, _composite
from . import library as _library
from ._dispatch import _LU_OF_TRANSPOSE, _NUMBER_TYPES, _factors_transpose, _is_view, _qualname
from ._dtypes import CODE

# Recompilation tracking ----------------------------------------------------

RECOMPILE_WARN_AFTER = 4  # warn when a function has compiled more often than this
_lock = threading.Lock()
_compiles = {}  # frame name -> number of graphs compiled for it
_last_inputs = {}  # frame name -> [(name, shape, dtype)]


def compile_counts():
    """{function: number of times torch.compile(backend="tpu") compiled it}."""
    with _lock:
        return dict(_compiles)


def _frame_name(gm):
    """(name, first): a name for the Python frame Dynamo compiled into gm,
    the function's name where the graph records it and Dynamo's frame id; and
    whether this is Dynamo's first compile of the frame (its frame ids restart
    after torch._dynamo.reset(), and so do our counts)."""
    func = cid = None
    try:
        from torch._guards import CompileContext, TracingContext

        cid = CompileContext.current_compile_id()
        tc = TracingContext.try_get()
        codes = getattr(tc, "traced_code", None)
        if codes:
            func = codes[0].co_name
    except Exception:
        pass
    if cid is None:
        return func or "<unknown>", False
    name = f"{func} (frame {cid.frame_id})" if func else f"frame {cid.frame_id}"
    return name, cid.frame_compile_id == 0


def _note_compile(name, inputs):
    sig = [(n, tuple(t.shape), t.dtype) for n, t in inputs if isinstance(t, torch.Tensor)]
    with _lock:
        count = _compiles.get(name, 0) + 1
        _compiles[name] = count
        prev = _last_inputs.get(name)
        _last_inputs[name] = sig
    if count > RECOMPILE_WARN_AFTER and prev is not None:
        # By name: a recompiled graph may take other inputs (a KV cache that
        # appears after the first step).
        before, after = {n: (s, d) for n, s, d in prev}, {n: (s, d) for n, s, d in sig}
        changed = [f"{n}: {tuple(before[n][0])}/{before[n][1]} -> {tuple(s)}/{d}" for n, (s, d) in after.items()
                   if n in before and before[n] != (s, d)]
        changed += [f"{n} is new" for n in after if n not in before]
        changed += [f"{n} is gone" for n in before if n not in after]
        what = "; ".join(changed) if changed else "guards other than input shapes or dtypes"
        warnings.warn(
            f"torch-pjrt: {name} was compiled {count} times (recompiled because of {what}). "
            f"Pad variable-length inputs to a few sizes with torch_pjrt.bucket() to avoid recompiles.",
            stacklevel=2,
        )


# Graph lowering ------------------------------------------------------------


class Unsupported(Exception):
    pass


def _type(val):
    if not isinstance(val, torch.Tensor):
        raise Unsupported(f"non-tensor value {type(val).__name__}")
    if val.dtype not in CODE:
        raise Unsupported(f"dtype {val.dtype}")
    shape = []
    for s in val.shape:
        if not isinstance(s, int):
            raise Unsupported("dynamic shapes")
        shape.append(s)
    return (CODE[val.dtype], tuple(shape))


def _on_cpu(val):
    if isinstance(val, torch.Tensor):
        return val.device.type == "cpu"
    return (isinstance(val, (list, tuple)) and len(val) > 0
            and all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in val))


def _host_nodes(graph, host, post):
    """The nodes that compute CPU values from CPU values only (host:
    _cpu_nodes) and that the graph's CPU results need (an optimizer's step
    counters), or the nodes run after the program (post) read.  They run on
    the host, as in eager mode, so those results never wait for the device.
    CPU values only the device needs (the step counters' bias corrections)
    are computed in the program, from the host's values: one upload, not a
    dozen small host ops per parameter."""
    out_node = next(n for n in graph.nodes if n.op == "output")
    need = [n for n in out_node.all_input_nodes if n in host]
    need += [i for n in post for i in n.all_input_nodes if i in host]
    need += [n for n in host if n.op == "call_function" and n.target is torch.ops.aten.copy_.default]
    keep = set()
    while need:
        n = need.pop()
        if n in keep:
            continue
        keep.add(n)
        need.extend(i for i in n.all_input_nodes if i in host)
    moved = set()
    for n in graph.nodes:
        if n in host and n not in keep:
            (moved if n.op == "call_function" and _lowerable(n, moved) else keep).add(n)
    return keep


def _post_nodes(graph, host):
    """The nodes that compute CPU values from device values (a copy to the
    CPU, and what the CPU computes from it) that the graph's outputs need
    (host: _cpu_nodes).  They run on the host after the program, as in
    eager mode: the outputs are CPU tensors, computed by the CPU's kernels.
    A CPU element of a node the program computes (the random state that
    run_and_save_rng_state describes as the CPU generator's) stays there."""
    post = set()
    need = list(next(n for n in graph.nodes if n.op == "output").all_input_nodes)
    while need:
        n = need.pop()
        if (n in post or n in host or n.op != "call_function" or n.target is torch.ops.aten.copy_.default
                or not _on_cpu(n.meta.get("val"))
                or n.target is operator.getitem and not _on_cpu(n.args[0].meta.get("val"))):
            continue
        post.add(n)
        need.extend(n.all_input_nodes)
    return post


# Ops whose kernel on tpu is PyTorch's generic one, which writes its outputs
# through a helper op that has a rule (eager mode runs the helper): in a
# graph the node is that helper, its output arguments left None (a rule
# writes its node's outputs).  op -> (helper, its output argument positions)
_VIA_HELPER = {torch.ops.aten.cummax.default: ("aten::_cummax_helper", (1, 2)),
               torch.ops.aten.cummin.default: ("aten::_cummin_helper", (1, 2))}


def _lowerable(n, moved):
    """Whether the program can compute call node n (a getitem: if it reads
    a node the program computes)."""
    if n.target is operator.getitem:
        return n.args[0] in moved
    if not isinstance(n.target, torch._ops.OpOverload):
        return False
    if n.target in _library._ops:  # a user's op with a device body
        return True
    name = _qualname(n.target)
    if name.startswith("aten::_foreach_"):
        base = n.target._schema.name.split("::")[1][len("_foreach_"):]
        t = _foreach_target(base, n.target._schema.overload_name or "default")
        return t is not None and _C.has_lowering(_qualname(t))
    return _C.has_lowering(_VIA_HELPER[n.target][0] if n.target in _VIA_HELPER else name)


def _cpu_nodes(graph, ph_vals):
    """The nodes that compute CPU values from CPU values only."""
    host = set()
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for n, v in zip(placeholders, ph_vals):
        if isinstance(v, torch.Tensor) and v.device.type == "cpu":
            host.add(n)
    for n in graph.nodes:
        if n.op == "get_attr":
            t = getattr(graph.owning_module, n.target, None)
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                host.add(n)
        elif n.op == "call_function" and all(i in host for i in n.all_input_nodes):
            if n.target is torch.ops.aten.copy_.default or _on_cpu(n.meta.get("val")):
                host.add(n)
    return host


_AS_STRIDED = (torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_copy.default)


def _ints(v):
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) for x in v):
        raise Unsupported("as_strided with symbolic sizes")
    return [int(x) for x in v]


def _as_strided_args(n, at=1):
    """as_strided(self, size, stride, storage_offset=None) of node n (at: the
    position of size; 2 for as_strided_scatter(self, src, size, ...)):
    (size, stride, offset or None, span): span is how many storage elements
    from the first one read it covers (0 for an empty result)."""
    args = list(n.args) + [None] * (at + 3 - len(n.args))
    size = _ints(args[at] if args[at] is not None else n.kwargs.get("size"))
    stride = _ints(args[at + 1] if args[at + 1] is not None else n.kwargs.get("stride"))
    off = args[at + 2] if args[at + 2] is not None else n.kwargs.get("storage_offset")
    if off is not None and not isinstance(off, int):
        raise Unsupported("as_strided with a symbolic storage offset")
    if len(size) != len(stride) or any(st < 0 for st in stride):
        raise Unsupported("as_strided with negative or mismatched strides")
    span = 0 if any(sz == 0 for sz in size) else 1 + sum((sz - 1) * st for sz, st in zip(size, stride))
    return size, stride, off, span


_ALIASING = (torch.ops.aten._unsafe_view.default, torch.ops.aten._reshape_alias.default)


def _view_step(cur, ops=()):
    """The view op call node cur passes through: cur itself, or for a getitem
    of split/unbind/chunk the op it indexes; None if cur is no view (ops:
    more ops to count as views)."""
    src = cur.args[0] if cur.target is operator.getitem else cur
    if (isinstance(src, torch.fx.Node) and src.op == "call_function" and isinstance(src.target, torch._ops.OpOverload)
            and (_is_view(src.target) or src.target in ops)):
        return src
    return None


def _view_root(x):
    """The node whose storage x views: up x's chain of view ops (a getitem of
    split/unbind/chunk included) to a graph input or a computed value."""
    dt = x.meta["val"].dtype
    cur = x
    while cur.op == "call_function" and (src := _view_step(cur)) is not None:
        nxt = src.args[0]
        val = nxt.meta.get("val") if isinstance(nxt, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor):
            raise Unsupported(f"as_strided of a view of {src.target}")
        if val.dtype != dt:  # view_as_real, view(dtype): storage counted in other units
            raise Unsupported("as_strided of a view that changes the dtype")
        cur = nxt
    return cur


def _alias_chain(o):
    """(root, chain) if graph output o is a chain of view ops on node root
    (chain: the view nodes from root to o; a getitem of split/unbind
    included) whose fake value shares root's storage and dtype, else None.
    Such an output need not be a program output: it is root's tensor viewed,
    as Inductor returns it (a saved weight's transpose, a value saved in two
    shapes), which saves XLA a copy of it per output.  A chain that changes
    the dtype (view(dtype), view_as_real) is replayed on root's tensor."""
    chain, cur = [], o
    while isinstance(cur, torch.fx.Node) and cur.op == "call_function":
        src = _view_step(cur, _ALIASING)
        if (src is None or not isinstance(src.args[0], torch.fx.Node)  # replayable: no other node arguments
                or any(isinstance(a, torch.fx.Node) for a in (*src.args[1:], *src.kwargs.values()))):
            break
        chain += [cur] if cur is src else [cur, src]
        cur = src.args[0]
    v, r = o.meta.get("val"), cur.meta.get("val")
    if (not chain or not isinstance(v, torch.Tensor) or not isinstance(r, torch.Tensor)
            or v.device.type != "tpu" or r.device.type != "tpu"):
        return None
    if v.is_conj() != r.is_conj() or v.is_neg() != r.is_neg():
        return None  # _conj / _neg_view: the program computes the values (graph values carry no lazy bits)
    if StorageWeakRef(v.untyped_storage()) != StorageWeakRef(r.untyped_storage()):
        return None
    return cur, chain[::-1]


def _replay(t, chain):
    """Graph nodes chain (view ops, getitems) applied to tensor t."""
    for n in chain:
        t = operator.getitem(t, n.args[1]) if n.target is operator.getitem else n.target(t, *n.args[1:], **n.kwargs)
    return t


def _memory_order(val):
    """The dims of val from the largest stride to the smallest, if val's
    elements fill the start of its storage (dense, no overlaps, offset 0):
    then its storage's first numel elements are val permuted so and
    flattened.  Else None."""
    if val.storage_offset() != 0:
        return None
    order = sorted(range(val.dim()), key=lambda d: -val.stride(d))
    expect = 1
    for d in reversed(order):
        if val.shape[d] == 1:
            continue
        if val.stride(d) != expect:
            return None
        expect *= val.shape[d]
    return order


class GraphProgram:
    """One FX graph of ATen ops, lowered to one program.  The program's
    parameters are, in order: the inputs that device nodes read, the graph's
    device constants, the host-computed values that device nodes read, and
    the storage windows that as_strided nodes read (_windows)."""

    def __init__(self, gm, example_inputs):
        self.gm = gm
        graph = gm.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        self.ninputs = len(placeholders)
        ph_vals = [n.meta.get("val", example_inputs[i] if i < len(example_inputs) else None)
                   for i, n in enumerate(placeholders)]
        # The random states that activation checkpointing passes from the
        # forward to the backward: 16 bytes (the partitioner describes
        # them as the CPU generator's state).
        for n in graph.find_nodes(op="call_function", target=_rng_prims.run_with_rng_state):
            if n.args[0] in placeholders:
                ph_vals[placeholders.index(n.args[0])] = _RNG_STATE
        for n in graph.nodes:  # a program's results are device tensors, with data
            v = n.meta.get("val")
            if any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in
                   (v if isinstance(v, (list, tuple)) else (v,))):
                raise Unsupported("tensors on the meta device")
        cpu = _cpu_nodes(graph, ph_vals)
        post = _post_nodes(graph, cpu)
        host = _host_nodes(graph, cpu, post)
        # The nodes run after the program only (none that the program reads).
        in_prog = [i for n in graph.nodes if n.op == "call_function" and n not in host and n not in post
                   for i in n.all_input_nodes if i in post]
        self.post_only = set(post)
        while in_prog:
            n = in_prog.pop()
            if n in self.post_only:
                self.post_only.discard(n)
                in_prog.extend(i for i in n.all_input_nodes if i in post)
        device_reads = set()  # host nodes that device nodes read
        for n in graph.nodes:
            if n.op == "call_function" and n not in host and n not in self.post_only:
                device_reads.update(i for i in n.all_input_nodes if i in host)
        out_node = next(n for n in graph.nodes if n.op == "output")
        host_outs = [o for o in out_node.args[0] if isinstance(o, torch.fx.Node) and o in host
                     and o.op != "placeholder"]
        # The part after the program: its inputs are graph inputs, host
        # values and program outputs (device tensors, which its copies bring
        # to the CPU); it returns the graph's outputs among its nodes.
        post_in = list(dict.fromkeys(i for n in graph.nodes if n in post for i in n.all_input_nodes if i not in post))
        host_outs += [i for i in post_in if i in host and i.op != "placeholder" and i not in host_outs]
        self.post_outs = {}  # graph output run after the program -> its index in post_gm's outputs
        for o in out_node.args[0]:
            if o in post:
                self.post_outs.setdefault(o, len(self.post_outs))
        self.post_gm = _post_graph(gm, post, post_in, list(self.post_outs)) if post else None
        self.post_in = post_in  # its input nodes; _set_outputs turns them into sources (as self.outputs')
        self.ph_index = {n: i for i, n in enumerate(placeholders)}
        self.rng_states = set()  # value ids of tp::rng_state nodes
        self.params = []  # per program parameter: ("in", input index) | ("const", tensor) | ("host", k)
        values = {}  # fx node -> value id, or tuple of ids for multi-output nodes
        types = []

        cpu_params = {}  # dtype -> [(node, src, type)]: CPU values the program reads

        def param(n, src, val):
            if isinstance(val, torch.Tensor) and val.device.type == "cpu":
                cpu_params.setdefault(val.dtype, []).append((n, src, _type(val)))
                return
            values[n] = len(types)
            types.append(_type(val))
            self.params.append(src)

        # CPU inputs that device nodes read and the host part overwrites: the
        # program reads their values from before the call.
        overwritten = {n.args[0] for n in host if n.op == "call_function" and n.target is torch.ops.aten.copy_.default}
        self.snapshot = {i for i, n in enumerate(placeholders) if n in device_reads and n in overwritten}
        for i, n in enumerate(placeholders):
            if n not in host or n in device_reads:
                if not isinstance(ph_vals[i], torch.Tensor) and all(u.op == "output" for u in n.users):
                    continue  # an opaque object (DTensor's device mesh) that is only passed on
                try:
                    param(n, ("in", i), ph_vals[i])
                except Unsupported as e:
                    # An input no program can take, read by a node: that node
                    # runs eagerly in a split graph.
                    e.node = next((u for u in n.users if u.op == "call_function"), None)
                    raise
        for n in graph.nodes:
            if n.op == "get_attr" and n not in host:
                t = getattr(gm, n.target)
                if isinstance(t, torch.fx.GraphModule):
                    continue  # a subgraph (torch.cond branch), lowered where it is called
                if not isinstance(t, torch.Tensor):
                    raise Unsupported(f"attribute {n.target}")
                param(n, ("const", t), t)
        # The host part: one small graph run with torch on the CPU before the
        # program, returning what the program reads and what the graph returns.
        feeds = [n for n in graph.nodes if n in device_reads and n.op != "placeholder"]
        self.host_gm = None
        if feeds or host_outs or any(n.op == "call_function" for n in host):
            self.host_gm = _host_graph(gm, host, feeds + host_outs)
        for k, n in enumerate(feeds):
            param(n, ("host", k), n.meta.get("val") if n.op != "get_attr" else getattr(gm, n.target))
        self.host_out_index = {n: len(feeds) + k for k, n in enumerate(host_outs)}
        # CPU values travel together, one transfer per dtype (an optimizer's
        # step counters): the program takes them packed and slices them.
        packs = []
        for dt, items in cpu_params.items():
            if len(items) == 1:
                n, src, ty = items[0]
                values[n] = len(types)
                types.append(ty)
                self.params.append(src)
                continue
            packs.append((len(types), items))
            types.append((CODE[dt], (sum(math.prod(ty[1]) for _, _, ty in items),)))
            self.params.append(("pack", [src for _, src, _ in items], all(not ty[1] for _, _, ty in items)))
        self.windows = {}  # as_strided node on a graph input's storage -> its window's value id
        for n in graph.nodes:
            if n.op == "call_function" and n not in host and n.target in _AS_STRIDED:
                w = self._window(n)
                if w is not None:
                    self.windows[n] = len(types)
                    types.append(_type(w[1]))
                    self.params.append(w[0])
        self.gid = _C.graph_new(types)
        for pid, items in packs:
            off = 0
            for n, _, (code, shape) in items:
                k = math.prod(shape)
                flat = _C.graph_add(self.gid, "aten::slice.Tensor", (("V", pid), 0, off, off + k, 1), [(code, (k,))])
                values[n] = _C.graph_add(self.gid, "aten::view", (("V", flat), list(shape)), [(code, shape)])
                off += k
        self.outputs = []  # per graph output: ("v", k) k-th program output | ("in", i) | ("host", k) | ("post", k) | ("const", value)
        self.out_specs = []
        # Inputs the graph mutates (copy_ into a placeholder, kept in the graph
        # by keep_inference_input_mutations): input index -> new value id.  The
        # program writes them as extra outputs straight into the input's
        # storage (its buffer donated), instead of a copy_ per input afterwards.
        # A CPU input given a host-computed value is written by the host part.
        self.mutations = {}
        try:
            self._vectorize_scalars(graph, host, values, packs)
            for n in graph.nodes:
                if n.op == "call_function" and n not in host and n not in values and n not in self.post_only:
                    try:
                        self._add(n, values)
                    except Unsupported as e:
                        e.node = getattr(e, "node", None) or n  # the node a split can run eagerly
                        raise
                elif n.op == "output":
                    self._set_outputs(n, values, ph_vals)
        except Exception:
            _C.graph_free(self.gid)
            raise
        # Per call, most parameters are device inputs passed as they are; the
        # few others (CPU values, windows, snapshots, packs) take work.
        self.direct = [src[1] if src[0] == "in" and src[1] not in self.snapshot and isinstance(ph_vals[src[1]], torch.Tensor)
                       and ph_vals[src[1]].device.type != "cpu" else -1 for src in self.params]
        self.special = [(k, src) for k, src in enumerate(self.params) if self.direct[k] < 0]

    def __del__(self):
        try:
            _C.graph_free(self.gid)
        except Exception:
            pass

    def _vectorize_scalars(self, graph, host, values, packs):
        """Pointwise arithmetic on packed CPU scalars (an optimizer's bias
        corrections: a few ops per parameter on its step count), done once on
        the whole pack instead of once per scalar.  XLA makes a kernel of each
        scalar chain that feeds a large fusion (two per parameter for AdamW);
        of the vector's, one.  An op (or one element of a _foreach_ op) is done
        so when each lane (each packed scalar) computes it: the same op with the
        same constants on the same value of its own lane; each lane's result is
        then its element of the vector."""
        size, sig, lane = {}, {}, {}  # pack value id -> lanes; node -> signature, (pack, lane)
        for pid, items in packs:
            if all(not ty[1] for _, _, ty in items):
                size[pid] = len(items)
                for j, (n, _, _) in enumerate(items):
                    sig[n], lane[n] = ("lane", pid), (pid, j)
        if not size:
            return

        def key(a):
            if isinstance(a, torch.fx.Node):
                return sig.get(a)
            if isinstance(a, (list, tuple)) and any(isinstance(x, torch.fx.Node) for x in a):
                return None
            return repr(a)

        classes = {}  # signature -> {lane: [(node, element)]}, in graph order
        ops = {}  # (node, element) -> (op, args, kwargs, by_position)
        for n in graph.nodes:
            if n.op != "call_function" or n in host:
                continue
            if n.target is operator.getitem and (n.args[0], n.args[1]) in ops:
                unit = (n.args[0], n.args[1])
                if unit in lane:
                    sig[n], lane[n] = sig[unit], lane[unit]
                continue
            if not isinstance(n.target, torch._ops.OpOverload):
                continue
            elems = _foreach_elements(n) if _qualname(n.target).startswith("aten::_foreach_") else \
                [(n.target, n.args, n.kwargs, n.meta.get("val"), False)]
            for k, (op, args, kwargs, val, by_position) in enumerate(elems or ()):
                inputs = [x for a in (*args, *kwargs.values()) for x in (a if isinstance(a, (list, tuple)) else (a,))
                          if isinstance(x, torch.fx.Node)]
                keys = [key(a) for a in args] + [(k_, key(a)) for k_, a in sorted(kwargs.items())]
                if (op is None or torch.Tag.pointwise not in op.tags or not isinstance(val, torch.Tensor)
                        or val.dim() != 0 or not inputs or any(x is None for x in keys)
                        or len({lane[x] for x in inputs}) != 1):
                    continue
                unit = (n, k)
                ops[unit] = (op, args, kwargs, by_position)
                sig[unit], lane[unit] = (op, val.dtype, tuple(keys)), lane[inputs[0]]
                if len(elems) == 1 and op is n.target:
                    sig[n], lane[n] = sig[unit], lane[unit]
                classes.setdefault(sig[unit], {}).setdefault(lane[unit][1], []).append(unit)
        vec, done = {}, {}  # signature -> (value id, first lane, lanes); node -> {element: value id}

        def lanes_of(x, a, b, code):  # lanes a..b-1 of a pack or of a vector
            vid, start, count = (lane[x][0], 0, size[lane[x][0]]) if sig[x][0] == "lane" else vec.get(sig[x], (0, 0, 0))
            if not (start <= a and b <= start + count):
                return None
            if (a, b) == (start, start + count):
                return vid
            return _C.graph_add(self.gid, "aten::slice.Tensor", (("V", vid), 0, a - start, b - start, 1),
                                [(code, (b - a,))])

        for s, by_lane in classes.items():
            a, b = min(by_lane), max(by_lane) + 1
            if b - a < 2 or len(by_lane) != b - a:  # a run of lanes (a parameter group's)
                continue
            op, args, kwargs, by_position = ops[by_lane[a][0]]
            inputs = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.fx.Node)]
            env = {x: lanes_of(x, a, b, CODE[x.meta["val"].dtype]) for x in inputs}
            if any(v is None for v in env.values()):
                continue
            code = CODE[s[1]]
            vid = self._add_op(op, args, kwargs, torch.empty(b - a, dtype=s[1], device="meta"), env,
                               by_position=by_position)
            vec[s] = (vid, a, b - a)
            for j, units in by_lane.items():
                one = _C.graph_add(self.gid, "aten::slice.Tensor", (("V", vid), 0, j - a, j - a + 1, 1), [(code, (1,))])
                one = _C.graph_add(self.gid, "aten::view", (("V", one), []), [(code, ())])
                for n, k in units:
                    done.setdefault(n, {})[k] = one
        for n, ids in done.items():  # a _foreach_ op: when all its elements are
            if not _qualname(n.target).startswith("aten::_foreach_"):
                values[n] = ids[0]
            elif len(ids) == len(n.meta["val"]):
                values[n] = tuple(ids[k] for k in range(len(ids)))

    def _arg(self, v, values, number_is_scalar):
        if isinstance(v, torch.fx.Node):
            vid = values.get(v)
            if not isinstance(vid, int):
                raise Unsupported(f"argument {v.name} is not a tensor value")
            return ("V", vid)
        if number_is_scalar and isinstance(v, (bool, int, float, complex)):
            code = 11 if isinstance(v, bool) else 4 if isinstance(v, int) else 10 if isinstance(v, complex) else 7
            return ("S", code, v, True)
        if isinstance(v, (list, tuple)):
            if any(isinstance(x, torch.fx.Node) for x in v):
                return ("L", [None if x is None else self._arg(x, values, False) for x in v])
            if all(isinstance(x, (int, bool)) for x in v):
                return [int(x) for x in v]
            return None
        if isinstance(v, torch.dtype):
            return CODE.get(v)
        if isinstance(v, (bool, int, float, str)) or v is None:
            return v
        return None  # device, layout, memory_format

    def _add(self, n, values):
        if n.target is operator.getitem:
            src, idx = n.args
            ids = values.get(src)
            if not isinstance(ids, tuple):
                raise Unsupported(f"getitem on {src.name}")
            values[n] = ids[idx]
            return
        if n.target is torch.ops.higher_order.cond:
            values[n] = self._add_cond(n, values)
            return
        if n.target is torch.ops.higher_order.invoke_subgraph:
            values[n] = tuple(self._add_subgraph(n.args[0], n.args[2:], values))
            return
        if n.target is _rng_prims.run_and_save_rng_state:
            # A checkpointed random op in the forward: (its state, its
            # outputs); the op draws from the state ...
            op, *args = n.args
            state = _C.graph_add(self.gid, "tp::rng_state", (), [_type(_RNG_STATE)])
            self.rng_states.add(state)
            values[n] = (state, self._add_op(op, args, n.kwargs, _meta_val(op, args, n.kwargs), values, key=state))
            return
        if n.target is _rng_prims.run_with_rng_state:
            # ... and its recomputation in the backward draws the same numbers.
            state, op, *args = n.args
            key = values.get(state)
            if not isinstance(key, int):
                raise Unsupported(f"random state {state}")
            values[n] = self._add_op(op, args, n.kwargs, _meta_val(op, args, n.kwargs), values, key=key)
            return
        if not isinstance(n.target, torch._ops.OpOverload):
            raise Unsupported(f"call to {n.target}")
        if n.target is torch.ops.aten.copy_.default and getattr(n.args[0], "op", None) == "placeholder":
            vid = self._add_op(torch.ops.aten.copy.default, n.args, n.kwargs, n.meta.get("val"), values)
            self.mutations[self.ph_index[n.args[0]]] = vid
            values[n] = vid
            return
        if _qualname(n.target).startswith("aten::_foreach_"):
            values[n] = self._add_foreach(n, values)
            return
        if n.target in _AS_STRIDED:
            values[n] = self._as_strided(n, values)
            return
        if n.target is torch.ops.aten.as_strided_scatter.default:
            values[n] = self._as_strided_scatter(n, values)
            return
        if n.target in _VIA_HELPER:
            helper, outs = _VIA_HELPER[n.target]
            args = list(_schema_args(n.target, n.args, n.kwargs))
            for i in outs:
                args.insert(i, None)
            vals = tuple(self._arg(a, values, False) for a in args)
            first = _C.graph_add(self.gid, helper, vals, [_type(o) for o in n.meta["val"]])
            values[n] = tuple(first + k for k in range(len(n.meta["val"])))
            return
        if n.target in _library._ops:
            values[n] = self._add_custom(n, values)
            return
        values[n] = self._add_op(n.target, n.args, n.kwargs, n.meta.get("val"), values)

    def _add_custom(self, n, values):
        """A user's op with a device body (torch_pjrt.library): a call of
        its function, which joins the graph's program."""
        from torch.utils import _pytree as pytree

        leaves = pytree.tree_leaves((n.args, n.kwargs))
        nodes = [a for a in leaves if isinstance(a, torch.fx.Node)]
        if not all(isinstance(a.meta.get("val"), torch.Tensor) for a in nodes):
            raise Unsupported(f"{n.target}: a non-tensor argument computed in the graph")
        args, kwargs = pytree.tree_map_only(torch.fx.Node, lambda a: a.meta["val"], (n.args, n.kwargs))
        val = n.meta.get("val")
        multi = isinstance(val, (tuple, list))
        outs = list(val) if multi else [val]
        text, entry, _ = _library.body_for(n.target, args, kwargs, outs)
        vals = (text, entry, *[self._arg(a, values, False) for a in nodes])
        first = _C.graph_add(self.gid, "tp::custom", vals, [_type(o) for o in outs])
        return tuple(first + k for k in range(len(outs))) if multi else first

    def _window(self, n):
        """as_strided reads its input's storage, not its elements in order
        (x.unfold compiles to it as well): of a graph input (or a view of one
        made in the graph) it can read elements outside the input's view.
        The program then gets a window of the input's storage, from the first
        element read (absolute, or relative to the input's offset when the
        node gives none: Dynamo does not guard storage offsets) over `span`
        elements: a view of the same storage, so nothing more is uploaded.
        Returns (param source, meta value), or None where no window is needed."""
        x = n.args[0]
        size, stride, off, span = _as_strided_args(n)
        root = _view_root(x)
        if root.op != "placeholder" or span == 0:
            return
        i = self.ph_index[root]
        if i in self.snapshot:
            raise Unsupported("as_strided of an input the host part overwrites")
        # ("win", input, start, relative, span); relative: start counts from the input's offset
        rel = off is None
        start = x.meta["val"].storage_offset() - root.meta["val"].storage_offset() if rel else off
        return ("win", i, start, rel, span), torch.empty((span,), dtype=x.meta["val"].dtype, device="meta")

    def _as_strided(self, n, values):
        """as_strided on the storage, as a flat value (r_as_strided indexes
        its input in row-major order): a window of a graph input's storage,
        or a value computed in the graph laid out in memory order."""
        x = n.args[0]
        size, stride, off, span = _as_strided_args(n)
        out = n.meta.get("val")
        if n in self.windows:
            return _C.graph_add(self.gid, "aten::as_strided", (("V", self.windows[n]), size, stride, 0),
                                [_type(out)])
        if span == 0:
            return self._add_op(n.target, n.args, n.kwargs, out, values)
        root = _view_root(x)
        rval = getattr(self.gm, root.target) if root.op == "get_attr" else root.meta.get("val")
        if not isinstance(rval, torch.Tensor) or not isinstance(values.get(root), int):
            raise Unsupported(f"as_strided of a view of {root.name}")
        order = _memory_order(rval)
        if order is None:
            raise Unsupported("as_strided of a view of a tensor that does not fill its storage")
        start = off if off is not None else x.meta["val"].storage_offset()
        numel = rval.numel()
        if start < 0 or start + span > numel:
            raise Unsupported("as_strided out of its storage's bounds")
        code, vid = CODE[rval.dtype], values[root]
        if order != sorted(order):
            vid = _C.graph_add(self.gid, "aten::permute", (("V", vid), order),
                               [(code, tuple(rval.shape[d] for d in order))])
        vid = _C.graph_add(self.gid, "aten::view", (("V", vid), [numel]), [(code, (numel,))])
        return _C.graph_add(self.gid, "aten::as_strided", (("V", vid), size, stride, start), [_type(out)])

    def _as_strided_scatter(self, n, values):
        """as_strided_scatter(self, src, ...) copies self's whole storage
        (clone_preserve_strides), writes src through its as_strided(...) and
        returns the copy viewed as self: positions count in self's storage.
        Lowered where self fills the start of its storage and the positions
        lie in self, which then holds them in memory order; r_as_strided_scatter
        counts positions row-major, so a self in another order is handed to it
        flattened in memory order and permuted back.  Elsewhere the fake
        tensors' layout of the result (a fresh clone) is not the CPU kernel's,
        and the graph runs eagerly."""
        x = n.args[0]
        sval = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        out = n.meta.get("val")
        order = _memory_order(sval) if isinstance(sval, torch.Tensor) else None
        if order is None or not isinstance(out, torch.Tensor) or out.stride() != sval.stride():
            raise Unsupported("as_strided_scatter into a tensor that does not fill its storage")
        size, stride, off, span = _as_strided_args(n, at=2)
        off, numel = off or 0, out.numel()
        if span > 0 and (off < 0 or off + span > numel):
            raise Unsupported("as_strided_scatter past the end of its input")
        if order == sorted(order):
            return self._add_op(n.target, n.args, n.kwargs, out, values)
        code = CODE[out.dtype]
        x = self._arg(x, values, False)
        rest = [self._arg(n.args[1], values, False), size, stride, off]
        pshape = tuple(out.shape[d] for d in order)
        inv = sorted(range(len(order)), key=lambda d: order[d])
        vid = _C.graph_add(self.gid, "aten::permute", (x, order), [(code, pshape)])
        vid = _C.graph_add(self.gid, "aten::view", (("V", vid), [numel]), [(code, (numel,))])
        vid = _C.graph_add(self.gid, "aten::as_strided_scatter", (("V", vid), *rest), [(code, (numel,))])
        vid = _C.graph_add(self.gid, "aten::view", (("V", vid), list(pshape)), [(code, pshape)])
        return _C.graph_add(self.gid, "aten::permute", (("V", vid), inv), [_type(out)])

    def _add_op(self, op, args, kwargs, val, values, by_position=False, key=-1):
        """Add one op node; returns its value id (or a tuple of ids).
        by_position: args fill the schema in order, keyword-only ones too.
        key: a random state's value id the op draws with (-1: a fresh key)."""
        name = _qualname(op)
        if not _C.has_lowering(name):
            raise Unsupported(name)
        vals = []
        for i, a in enumerate(op._schema.arguments):
            if i < len(args) and (by_position or not a.kwarg_only):
                v = args[i]
            elif a.name in kwargs:
                v = kwargs[a.name]
            elif a.has_default_value():
                v = a.default_value
            else:
                v = None
            vals.append(self._arg(v, values, str(a.type) in _NUMBER_TYPES))
        if name in _LU_OF_TRANSPOSE:
            vals[0] = self._lu_of_transpose(args[0], vals[0])
        multi = isinstance(val, (tuple, list))
        outs = list(val) if multi else [val]
        defined = [o for o in outs if o is not None]
        first = _C.graph_add(self.gid, name, tuple(vals), [_type(o) for o in defined], key)
        ids, k = [], 0
        for o in outs:
            if o is None:
                ids.append(None)
            else:
                ids.append(first + k)
                k += 1
        return tuple(ids) if multi else ids[0]

    def _lu_of_transpose(self, a, v):
        """det/slogdet factor A^T when A is contiguous and real, as eager mode
        does (_dispatch._LU_OF_TRANSPOSE): their backward formulas read the
        LU and pivots outputs so, from the traced A's layout."""
        t = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
        if not isinstance(t, torch.Tensor) or t.dim() < 2 or not _factors_transpose(t):
            return v
        order = list(range(t.dim() - 2)) + [t.dim() - 1, t.dim() - 2]
        return ("V", _C.graph_add(self.gid, "aten::permute", (v, order), [_type(t.mT)]))

    def _add_cond(self, n, values):
        """torch.cond(pred, true_fn, false_fn, operands): both branches are
        lowered into the program and each output selected by pred (a
        program has no data-dependent control flow here; the branches are
        functional, so computing the other one changes no result)."""
        pred, true_node, false_node, operands = n.args
        if not isinstance(pred, torch.fx.Node):
            raise Unsupported("torch.cond with a constant predicate")
        pid = self._arg(pred, values, False)
        branches = [self._add_subgraph(node, operands, values) for node in (true_node, false_node)]
        if None in branches[0] + branches[1]:
            raise Unsupported("a torch.cond branch returning None")
        vals = n.meta.get("val")
        return tuple(_C.graph_add(self.gid, "aten::where.self", (pid, ("V", t), ("V", f)), [_type(v)])
                     for t, f, v in zip(branches[0], branches[1], vals))

    def _add_subgraph(self, node, operands, values):
        """The nodes of a subgraph (a get_attr graph module: a torch.cond
        branch, a nested_compile_region) on the operands' values, inline;
        returns its outputs' value ids."""
        sub = getattr(self.gm, node.target)
        inner = dict(zip([p for p in sub.graph.nodes if p.op == "placeholder"],
                         [values.get(o) for o in operands]))
        for m in sub.graph.nodes:
            if m.op == "call_function":
                self._add(m, inner)
            elif m.op == "get_attr":
                raise Unsupported("a subgraph with attributes")
            elif m.op == "output":
                outs = m.args[0]
        ids = [None if o is None else inner.get(o) for o in outs]  # None: no gradient
        if not all(isinstance(i, int) for o, i in zip(outs, ids) if o is not None):
            raise Unsupported("subgraph outputs that are not tensors")
        return ids

    def _add_foreach(self, n, values):
        """_foreach_<op>: one node per list element, with the per-tensor op."""
        elems = _foreach_elements(n)
        if elems is None or any(op is None for op, *_ in elems):
            raise Unsupported(_qualname(n.target))
        return tuple(self._add_op(op, args, kwargs, val, values, by_position=bp) for op, args, kwargs, val, bp in elems)

    def _aliases(self, n, values, ph_vals):
        """{graph output: (base, chain)} for the outputs returned as views of
        another tensor: of a device input the graph does not write; of a
        computed value that is itself returned or that two outputs view; and,
        among the tensors saved for the backward (which only the backward
        reads), of another saved tensor of the same value and layout (softmax's
        result saved for its own backward and, cloned, for a matmul's)."""
        outs = n.args[0]
        descs = n.meta.get("desc") or [None] * len(outs)
        groups = {}  # root -> [(output, chain, saved for the backward)]
        for o, d in zip(outs, descs):
            if (isinstance(o, torch.fx.Node) and o.op != "placeholder" and o not in self.host_out_index
                    and o not in self.post_outs):
                root, chain = _alias_chain(o) or (o, [])
                groups.setdefault(root, []).append((o, chain, isinstance(d, SavedForBackwardsAOTOutput)))
        base, same = {}, {}  # root -> the tensor its outputs view; (value, layout) -> root
        for root, members in groups.items():
            val = root.meta.get("val")
            if root in self.ph_index:
                i = self.ph_index[root]
                if ph_vals[i].device.type == "tpu" and i not in self.mutations and i not in self.snapshot:
                    base[root] = root
            elif (isinstance(values.get(root), int) and values[root] not in self.rng_states
                  and root.op == "call_function" and isinstance(val, torch.Tensor) and val.device.type == "tpu"
                  and val.storage_offset() == 0 and 0 not in val.stride()):
                base[root] = root
                if all(saved for _, _, saved in members):
                    src = root  # a clone of the same layout holds the same values
                    while (src.target is torch.ops.aten.clone.default and isinstance(src.args[0], torch.fx.Node)
                           and isinstance(values.get(src.args[0]), int)
                           and src.args[0].meta["val"].stride() == val.stride()):
                        src = src.args[0]
                    base[root] = same.setdefault((values[src], tuple(val.shape), tuple(val.stride())), root)
        uses = {}
        for root, members in groups.items():
            if root in base:
                uses[base[root]] = uses.get(base[root], 0) + len(members)
        return {o: (base[root], chain) for root, members in groups.items() if root in base
                and (base[root] in self.ph_index or uses[base[root]] > 1)
                for o, chain, _ in members if not (o is base[root] and not chain)}

    def _set_outputs(self, n, values, ph_vals):
        prog, index = [], {}  # program outputs (value ids); node -> its index in prog

        def program_output(o):
            if o in index:
                return index[o]
            vid = values.get(o)
            if not isinstance(vid, int):
                raise Unsupported(f"graph output {o}")
            val = _RNG_STATE if vid in self.rng_states else o.meta["val"]
            shape, stride = tuple(val.shape), tuple(val.stride())
            # An expanded output (stride 0, as expand() gives, also in
            # tensors saved for backward): the program writes one copy
            # of each repeated slice, returned viewed as the graph's.
            full = None
            if any(st == 0 and sz > 1 for sz, st in zip(shape, stride)):
                full, code, cur = shape, CODE[val.dtype], list(shape)
                for d, (sz, st) in enumerate(zip(shape, stride)):
                    if st == 0 and sz > 1:
                        cur[d] = 1
                        vid = _C.graph_add(self.gid, "aten::slice.Tensor", (("V", vid), d, 0, 1, 1),
                                           [(code, tuple(cur))])
                shape = tuple(cur)
            index[o] = len(prog)
            prog.append(vid)
            self.out_specs.append((shape, stride, val.dtype, full))
            return index[o]

        aliases = self._aliases(n, values, ph_vals)
        for o in n.args[0]:
            if o in aliases:
                root, chain = aliases[o]
                v = o.meta["val"]
                r = ph_vals[self.ph_index[root]] if root in self.ph_index else root.meta["val"]
                # as_strided keeps the base's dtype: a view that changes it is replayed (view None)
                view = (tuple(v.shape), tuple(v.stride()), v.storage_offset()) if v.dtype == r.dtype else None
                if root in self.ph_index:  # offsets from the traced input's
                    i = self.ph_index[root]
                    if view is not None:
                        view = (*view[:2], view[2] - r.storage_offset())
                    self.outputs.append(("alias", ("in", i), view, (tuple(r.shape), tuple(r.stride())), chain))
                else:
                    self.outputs.append(("alias", ("v", program_output(root)), view, None, chain))
            elif not isinstance(o, torch.fx.Node):  # None, or a number (a size _Specialize made concrete)
                self.outputs.append(("const", o))
            elif o in self.ph_index:  # an input returned as it is
                self.outputs.append(("in", self.ph_index[o]))
            elif o in self.host_out_index:
                self.outputs.append(("host", self.host_out_index[o]))
            elif o in self.post_outs:
                self.outputs.append(("post", self.post_outs[o]))
            else:
                self.outputs.append(("v", program_output(o)))
        self.post_in = [("in", self.ph_index[i]) if i in self.ph_index else ("host", self.host_out_index[i])
                        if i in self.host_out_index else ("v", program_output(i)) for i in self.post_in]
        on_cpu = [i for i in self.mutations if ph_vals[i].device.type == "cpu"]
        self.mut_inputs = [i for i in self.mutations if i not in on_cpu]
        # New values that the program computes for CPU inputs: one packed
        # output per dtype.
        self.host_muts = {}  # dtype -> [(input index, numel)]
        for i in on_cpu:
            self.host_muts.setdefault(ph_vals[i].dtype, []).append((i, ph_vals[i].numel()))
        packed = []
        for dt, items in self.host_muts.items():
            code = CODE[dt]
            flat = [_C.graph_add(self.gid, "aten::view", (("V", self.mutations[i]), [k]), [(code, (k,))])
                    for i, k in items]
            total = sum(k for _, k in items)
            packed.append(_C.graph_add(self.gid, "aten::cat", (("L", [("V", v) for v in flat]), 0),
                                       [(code, (total,))]))
        _C.graph_outputs(self.gid, prog + [self.mutations[i] for i in self.mut_inputs] + packed)
        # The outputs' layouts, flat as run_graph takes them: rank, sizes, strides, dtype code.
        self.out_flat = [v for shape, stride, dt, _ in self.out_specs
                         for v in (len(shape), *shape, *stride, CODE[dt])]

    def __call__(self, *args):
        device = 0
        for t in args:
            if isinstance(t, torch.Tensor) and t.device.type == "tpu":
                device = t.device.index
                break
        dev = torch.device("tpu", device)

        def value(src):  # an "in" or "const" source (host values come later)
            if src[0] == "in":  # run_graph checks that device inputs are on dev
                return args[src[1]].clone() if src[1] in self.snapshot else args[src[1]]
            if src[0] == "win":  # a window of an input's storage (as_strided)
                _, i, start, rel, span = src
                t = args[i]
                return t.as_strided((span,), (1,), start + (t.storage_offset() if rel else 0))
            return src[1] if src[0] == "const" else None

        params = [args[i] if i >= 0 else None for i in self.direct]
        for k, src in self.special:  # what must be read before the host part runs
            params[k] = [value(s) for s in src[1]] if src[0] == "pack" else value(src)
        host_vals = self.host_gm(*args) if self.host_gm is not None else ()
        for k, src in self.special:
            v = params[k]
            if src[0] == "host":
                v = host_vals[src[1]]
            elif src[0] == "pack":
                parts = [host_vals[s[1]] if s[0] == "host" else x for s, x in zip(src[1], v)]
                with torch.no_grad():  # 0-d values (step counters): stacked, the rest flattened
                    v = torch.stack(parts) if src[2] else torch.cat([t.reshape(-1) for t in parts])
            params[k] = v.to(dev) if v.device.type == "cpu" else v
        packed = [torch.empty(sum(k for _, k in items), dtype=dt, device=dev)
                  for dt, items in self.host_muts.items()]
        # csrc/glue/graph.cpp: allocates the outputs, runs the program.
        mutated = [args[i] for i in self.mut_inputs] + packed
        outs = torch.ops.torch_pjrt.run_graph.default(self.gid, params, mutated, self.out_flat, dev)
        for p, items in zip(packed, self.host_muts.values()):
            host, off = p.cpu(), 0  # one transfer back per dtype
            for i, k in items:
                args[i].copy_(host[off:off + k].view(args[i].shape))
                off += k

        def output(k):
            o, full = outs[k], self.out_specs[k][3]
            return o if full is None else o.as_strided(full, o.stride())

        if self.post_gm is not None:  # after the program, on the host (its copies wait for the device)
            post = self.post_gm(*[args[k] if src == "in" else host_vals[k] if src == "host" else output(k)
                                  for src, k in self.post_in])
        result = []
        for kind in self.outputs:
            if kind[0] == "v":
                result.append(output(kind[1]))
            elif kind[0] == "post":
                result.append(post[kind[1]])
            elif kind[0] == "alias":  # a view of an input or of another output
                (src, k), view, traced, chain = kind[1:]
                base = args[k] if src == "in" else outs[k]
                if view is None:  # another dtype (view(dtype)): the chain's view ops
                    result.append(_replay(base, chain))
                elif traced is None:
                    result.append(base.as_strided(*view))
                elif (base.shape, base.stride()) == traced:
                    result.append(base.as_strided(view[0], view[1], base.storage_offset() + view[2]))
                else:  # an input laid out otherwise than when traced
                    result.append(_replay(base, chain))
            elif kind[0] == "in":
                result.append(args[kind[1]])
            elif kind[0] == "host":
                result.append(host_vals[kind[1]])
            else:
                result.append(kind[1])
        return result


# Activation checkpointing's random states (torch.tpu.get_rng_state()'s
# form: the seed and the counter of the key a random op draws with).
_RNG_STATE = torch.empty(16, dtype=torch.uint8)


def _meta_val(op, args, kwargs):
    """op's outputs for the args' values, on the meta device (the nodes the
    partitioner adds for checkpointed random ops carry none)."""
    def meta(a):
        v = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
        if isinstance(v, torch.Tensor):
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
        return v

    return op(*torch.fx.node.map_aggregate(args, meta), **torch.fx.node.map_aggregate(kwargs, meta))


def _host_graph(gm, host, outputs):
    """A GraphModule of the host nodes: all of gm's inputs in, `outputs` out."""
    g = torch.fx.Graph()
    env = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder" or n in host:
            env[n] = g.node_copy(n, lambda a: env[a])
    g.output(tuple(env[n] for n in outputs))
    _batch_scalar_foreach(g)
    _batch_input_copies(g)
    return torch.fx.GraphModule(gm, g)


def _post_graph(gm, post, inputs, outputs):
    """A GraphModule of the nodes run after the program: `inputs` in,
    `outputs` out."""
    g = torch.fx.Graph()
    env = {n: g.placeholder(n.name) for n in inputs}
    for n in gm.graph.nodes:
        if n in post:
            env[n] = g.node_copy(n, lambda a: env[a])
    g.output(tuple(env[n] for n in outputs))
    return torch.fx.GraphModule(gm, g)


def _batch_scalar_foreach(g):
    """A pointwise _foreach_ op on 0-d tensors of one dtype (an optimizer's
    step counters, `steps += 1`), run as one op on their stack: PyTorch's CPU
    foreach kernels take about 4 us per tensor."""
    for n in list(g.nodes):
        if (n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload)
                or not _qualname(n.target).startswith("aten::_foreach_")):
            continue
        schema = n.target._schema.arguments
        full, lists = _by_position(n)
        elems = _foreach_elements(n)
        op = elems[0][0] if elems else None
        tensors = [x for i in lists for x in full[i]]
        vals = [x.meta.get("val") if isinstance(x, torch.fx.Node) else None for x in tensors]
        others = [x for i, a in enumerate(full) if i not in lists for x in (a if isinstance(a, (list, tuple)) else (a,))]
        if (op is None or torch.Tag.pointwise not in op.tags or len(elems) < 2
                or any(str(schema[i].type) != "List[Tensor]" for i in lists)  # a list of scalars: one per tensor
                or not all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in vals)
                or len({v.dtype for v in vals}) != 1 or any(isinstance(x, torch.fx.Node) for x in others)):
            continue
        with g.inserting_before(n):
            args, kwargs = [], {}
            for i, a in enumerate(op._schema.arguments[:len(full)]):
                v = g.call_function(torch.ops.aten.stack.default, (list(full[i]),)) if i in lists else full[i]
                if a.kwarg_only:
                    kwargs[a.name] = v
                else:
                    args.append(v)
            out = g.call_function(torch.ops.aten.unbind.int, (g.call_function(op, tuple(args), kwargs),))
        n.replace_all_uses_with(out)
        g.erase_node(n)


def _batch_input_copies(g):
    """The host part's copy_ of new values into its inputs (the step counters),
    as one _foreach_copy_ where the last of them was."""
    nodes = list(g.nodes)
    copies = [n for n in nodes if n.op == "call_function" and n.target is torch.ops.aten.copy_.default
              and n.args[0].op == "placeholder" and not n.users and len(n.args) == 2]
    dsts = {c.args[0] for c in copies}
    if len(copies) < 2 or len(dsts) != len(copies) or any(c.args[1] in dsts for c in copies):
        return
    for c in copies:  # nothing else may read a destination after its copy
        if any(u is not c and nodes.index(u) > nodes.index(c) and u not in copies for u in c.args[0].users):
            return
    with g.inserting_after(copies[-1]):
        g.call_function(torch.ops.aten._foreach_copy_.default, ([c.args[0] for c in copies], [c.args[1] for c in copies]))
    for c in copies:
        g.erase_node(c)


# _foreach_<base>.<overload> -> the per-tensor op applied to each element.
_FOREACH_OVERLOADS = {
    "List": ("Tensor", "Tensor_Tensor", "default"),
    "Scalar": ("Tensor", "Tensor_Scalar", "Scalar", "default"),
    "ScalarList": ("Tensor", "Tensor_Scalar", "Scalar", "default"),
    "Tensor": ("Tensor", "default"),
    "ScalarAndTensor": ("Scalar",),
    "default": ("default",),
}
_FOREACH_SPECIAL = {("lerp", "Scalar"): "Scalar", ("lerp", "ScalarList"): "Scalar", ("lerp", "List"): "Tensor",
                    ("addcdiv", "Scalar"): "default", ("addcdiv", "ScalarList"): "default",
                    ("addcmul", "Scalar"): "default", ("addcmul", "ScalarList"): "default"}
_FOREACH_RENAME = {("maximum", "Scalar"): ("clamp_min", "default"), ("maximum", "ScalarList"): ("clamp_min", "default"),
                   ("minimum", "Scalar"): ("clamp_max", "default"), ("minimum", "ScalarList"): ("clamp_max", "default"),
                   ("copy", "default"): ("copy", "default")}


def _schema_args(op, args, kwargs):
    """op's arguments in its schema's order, defaults filled in."""
    return [args[i] if i < len(args) else kwargs.get(a.name, a.default_value if a.has_default_value() else None)
            for i, a in enumerate(op._schema.arguments)]


def _by_position(n):
    """Call node n's arguments in its schema's order, defaults filled in; and
    the positions of its list arguments."""
    return _schema_args(n.target, n.args, n.kwargs), [i for i, a in enumerate(n.target._schema.arguments)
                                                      if str(a.type).startswith("List[")]


def _foreach_elements(n):
    """A _foreach_<op> node's per-tensor ops: [(op, args, kwargs, val,
    by_position)], one per list element; None if it has no per-tensor op."""
    op = n.target
    base = op._schema.name.split("::")[1][len("_foreach_"):]
    target = _foreach_target(base, op._schema.overload_name or "default")
    if target is None:
        return None
    args, lists = _by_position(n)
    vals = n.meta.get("val")
    out = []
    for k in range(len(args[lists[0]]) if lists else 0):
        elem = [a[k] if i in lists else a for i, a in enumerate(args)]
        if base == "norm":  # (x, ord, dtype) -> linalg_vector_norm(x, ord, dim, keepdim, dtype)
            elem = [elem[0], elem[1], None, False, elem[2] if len(elem) > 2 else None]
        out.append((target, elem, {}, vals[k] if vals is not None else None, True))
    return out


def _foreach_target(base, ovl):
    if (base, ovl) in _FOREACH_RENAME:
        base, want = _FOREACH_RENAME[(base, ovl)]
        choices = (want,)
    elif (base, ovl) in _FOREACH_SPECIAL:
        choices = (_FOREACH_SPECIAL[(base, ovl)],)
    else:
        choices = _FOREACH_OVERLOADS.get(ovl, ())
    if base == "norm":  # its per-tensor op, norm.Scalar, has no dtype argument
        return torch.ops.aten.linalg_vector_norm.default
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    for c in choices:
        if c in packet.overloads():
            return getattr(packet, c)
    return None


def _rng_device(args):
    return next((a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "tpu"), None)


def _run_and_save_rng_state(op, *args, **kwargs):
    return torch.tpu.get_rng_state(_rng_device(args)), op(*args, **kwargs)


def _run_with_rng_state(state, op, *args, **kwargs):
    dev = _rng_device(args)
    saved = torch.tpu.get_rng_state(dev)
    torch.tpu.set_rng_state(state, dev)
    try:
        return op(*args, **kwargs)
    finally:
        torch.tpu.set_rng_state(saved, dev)


def _register_rng_hops():
    """The tpu kernels of higher-order ops.  Those activation checkpointing
    wraps random ops in (PyTorch has them for CPU, CUDA, HPU and XPU only),
    for graphs that run op by op: the recomputation in the backward restores
    the forward's state, so it draws the same numbers.  Their BackendSelect
    kernel picks the device's kernel from a fixed table, which lacks tpu.
    And out_dtype's (_out_dtype)."""
    from torch._C import DispatchKey

    for hop, impl, first in ((_rng_prims.run_and_save_rng_state, _run_and_save_rng_state, 1),
                             (_rng_prims.run_with_rng_state, _run_with_rng_state, 2)):
        if DispatchKey.PrivateUse1 in hop.py_kernels:
            continue
        hop.py_impl(DispatchKey.PrivateUse1)(impl)
        select = hop.py_kernels.pop(DispatchKey.BackendSelect)

        def backend_select(*args, _impl=impl, _select=select, _first=first, **kwargs):
            if _rng_prims.get_device(args[_first:], kwargs) == "tpu":
                return _impl(*args, **kwargs)
            return _select(*args, **kwargs)

        hop.py_impl(DispatchKey.BackendSelect)(backend_select)
        hop._dispatch_cache.clear()
    from torch._higher_order_ops.out_dtype import out_dtype

    if DispatchKey.PrivateUse1 not in out_dtype.py_kernels:
        out_dtype.py_impl(DispatchKey.PrivateUse1)(_out_dtype)
        out_dtype._dispatch_cache.clear()


_warned = set()
_graph_counts = {"graphs_lowered": 0, "graphs_split": 0, "graphs_eager": 0}  # AOTAutograd graphs, by how they run


def graph_counts():
    """{"graphs_lowered": graphs compiled to one program, "graphs_split":
    graphs cut into programs around ops compiled mode cannot lower, which run
    eagerly between them, "graphs_eager": graphs that run op by op (what
    they hold cannot be cut out)}; the warning names the cause only once per
    process, these count every graph."""
    with _lock:
        return dict(_graph_counts)


def _allow_flex_attention():
    """torch.nn.attention.flex_attention refuses devices outside a fixed list
    (CUDA, CPU, XPU, HPU, MPS) before it runs.  On tpu it runs as on the
    CPU: eagerly through its dense implementation, compiled as that
    implementation's ATen ops in the graph's program (_inline_dense_hops),
    and, unlike the CPU, with a backward."""
    from torch.nn.attention import flex_attention as fa

    check = fa._validate_device
    if getattr(check, "_tp_allows", False):
        return

    def _validate_device(query, key, value):
        if query.device.type != "tpu":
            check(query, key, value)

    _validate_device._tp_allows = True
    fa._validate_device = _validate_device


def _dense_hops():
    """Higher-order ops that graphs lower through the dense implementation
    they run in eager mode: FlexAttention's forward and backward (PyTorch's
    CompositeExplicitAutograd kernel, any device; its fused kernels are
    Inductor templates for CUDA and CPU only), and out_dtype (ours, below)."""
    import importlib

    fa = importlib.import_module("torch._higher_order_ops.flex_attention")  # the package's name is the op
    return {torch.ops.higher_order.flex_attention: fa.sdpa_dense,
            torch.ops.higher_order.flex_attention_backward: fa.sdpa_dense_backward,
            torch.ops.higher_order.out_dtype: _out_dtype}


def _out_dtype(op, output_dtype, *args):
    """The out_dtype higher-order op on tpu (torchao's int8 x int8 matmuls:
    out_dtype(aten.mm, torch.int32, a, b)).  PyTorch's kernel runs an int8 mm
    as torch._int_mm on CUDA and XPU only, and elsewhere as an int32 mm of
    the widened operands; on tpu _int_mm is an integer dot with int32
    accumulation (lower_reduce.c), exact as both.  Any other op: PyTorch's
    fallback (widen to the promoted dtype, run, cast)."""
    from torch._higher_order_ops import out_dtype as od

    if (op is torch.ops.aten.mm.default and output_dtype == torch.int32 and len(args) == 2
            and all(isinstance(a, torch.Tensor) and a.dtype == torch.int8 for a in args)):
        return torch._int_mm(*args)
    return od.out_dtype_fallback(op, output_dtype, *args)


def _inline_dense_hops(gm):
    """Replace each node of a _dense_hops() op by the ATen ops of its dense
    implementation, traced on the node's fake inputs (functionalized, with
    the graphs' decompositions), so that the whole graph stays one program.
    The implementation computes the scores matrix whole (in float32 for
    lower-precision inputs, as on the CPU), which is how the op runs eagerly."""
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils import _pytree as pytree

    hops, inlined = None, False
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or not isinstance(n.target, torch._ops.HigherOrderOperator):
            continue
        hops = hops or _dense_hops()
        if n.target not in hops:
            continue
        single = isinstance(n.meta.get("val"), torch.Tensor)  # one result, else a tuple its getitems take apart
        if not single and any(u.target is not operator.getitem for u in n.users):
            continue
        flat, spec = pytree.tree_flatten((n.args, n.kwargs))
        tensor_at = [i for i, a in enumerate(flat) if isinstance(a, torch.fx.Node) and a.op != "get_attr"
                     and isinstance(a.meta.get("val"), torch.Tensor)]

        def dense(*tensors, _flat=flat, _at=tensor_at, _spec=spec, _impl=hops[n.target]):
            vals = list(_flat)
            for i, t in zip(_at, tensors):
                vals[i] = t
            for i, a in enumerate(vals):
                if isinstance(a, torch.fx.Node):
                    vals[i] = getattr(gm, a.target) if a.op == "get_attr" else a.meta["val"]
            args, kwargs = pytree.tree_unflatten(vals, _spec)
            return _impl(*args, **kwargs)

        fake = [flat[i].meta["val"] for i in tensor_at]
        try:
            with detect_fake_mode(fake) or contextlib.nullcontext():
                sub = make_fx(torch.func.functionalize(dense), decomposition_table=_decompositions())(*fake)
        except Exception:
            continue  # left whole: the graph is cut around it (_split_graph)
        env = {}
        added = []
        inputs = iter(flat[i] for i in tensor_at)
        with gm.graph.inserting_before(n):
            for m in sub.graph.nodes:
                if m.op == "placeholder":
                    env[m] = next(inputs)
                elif m.op == "get_attr":
                    name = f"_tp_dense_{len(gm.graph.nodes)}_{m.target}"
                    gm.register_buffer(name, getattr(sub, m.target))
                    env[m] = gm.graph.get_attr(name)
                    env[m].meta.update(m.meta)
                    added.append(env[m])
                elif m.op == "output":
                    result = pytree.tree_map(lambda x: env[x] if isinstance(x, torch.fx.Node) else x, m.args[0])
                else:
                    env[m] = gm.graph.node_copy(m, lambda x: env[x])
                    added.append(env[m])

        def replace(node, value):  # node's getitem users take value's parts
            for u in list(node.users):
                part = value[u.args[1]]
                if isinstance(part, torch.fx.Node):
                    u.replace_all_uses_with(part)
                else:
                    replace(u, part)
                gm.graph.erase_node(u)

        if single:
            n.replace_all_uses_with(result)
        else:
            replace(n, result)
        gm.graph.erase_node(n)
        for m in reversed(added):  # the parts of the implementation nothing reads
            if not m.users and not m.is_impure():
                gm.graph.erase_node(m)
        inlined = True
    if inlined:
        gm.recompile()
    return gm


class _ProgramModule(torch.nn.Module):
    """A GraphProgram as a submodule of a split graph."""

    def __init__(self, prog):
        super().__init__()
        self.prog = prog

    def forward(self, *args):
        return tuple(self.prog(*args))


_MAX_SPLITS = 32  # nodes run eagerly before a graph runs wholly op by op


def _split_graph(gm, example_inputs, err):
    """The graph cut at the nodes that cannot be lowered (err.node first):
    the nodes between them become programs, the cut nodes run eagerly
    between the programs, in the graph's order (random ops draw in the same
    order).  Each program that fails to build names the next node to cut.
    Returns the split graph module and the cut nodes' names, or None when
    a failure names no node."""
    from torch.fx.passes.split_module import split_module

    vals = {n.name: n.meta.get("val") for n in gm.graph.nodes}
    for n, v in zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs):
        vals.setdefault(n.name, v)
    cut = []
    while True:
        bad = getattr(err, "node", None)
        if bad is None or bad.name in cut or len(cut) >= _MAX_SPLITS:
            return None
        cut.append(bad.name)
        part, k = {}, 0
        for n in gm.graph.nodes:
            if n.op != "call_function":
                continue
            if n.target is operator.getitem and n.args[0] in part:
                part[n] = part[n.args[0]]  # a tuple never crosses partitions
            elif n.name in cut:
                part[n] = k + 1
                k += 2
            else:
                part[n] = k
        split = split_module(gm, None, lambda n: part[n], keep_original_order=True,
                             keep_original_node_name=True, tuple_return=True)
        err = None
        for call in split.graph.find_nodes(op="call_module"):
            sub = getattr(split, call.target)
            if any(n.op == "call_function" and n.name in cut for n in sub.graph.nodes):
                continue  # runs eagerly
            phs = [n for n in sub.graph.nodes if n.op == "placeholder"]
            for ph in phs:
                ph.meta["val"] = vals.get(ph.name)
            try:
                prog = GraphProgram(sub, [ph.meta["val"] for ph in phs])
            except Unsupported as e:
                node = getattr(e, "node", None)
                e.node = next((n for n in gm.graph.nodes if node is not None and n.name == node.name), None)
                err = e
                break
            setattr(split, call.target, _ProgramModule(prog))
        if err is None:
            return split, cut


def _compile_graph(gm, example_inputs):
    try:
        gm = _inline_dense_hops(gm)
        prog = GraphProgram(gm, example_inputs)
    except Unsupported as e:
        from functorch.compile import make_boxed_func

        split = _split_graph(gm, example_inputs, e)
        if split is not None:
            split, cut = split
            with _lock:
                _graph_counts["graphs_split"] += 1
            names = sorted({_qualname(n.target) if isinstance(n.target, torch._ops.OpOverload)
                            else getattr(n.target, "__name__", str(n.target))
                            for n in gm.graph.nodes if n.name in cut})
            what = ", ".join(names)
            # torch.distributed's collectives run between programs by design
            # (the "tpu" backend relays them through Gloo, docs/architecture.md
            # "Distributed"): nothing to warn about.
            collectives = all(name.startswith("_c10d_functional::") for name in names)
            if not collectives and ("split", what) not in _warned:
                _warned.add(("split", what))
                warnings.warn(f"torch-pjrt: running {what} eagerly between compiled programs "
                              f"(compiled mode cannot lower it yet).", stacklevel=2)
            return make_boxed_func(split.forward)
        with _lock:
            _graph_counts["graphs_eager"] += 1
        key = str(e)
        if key not in _warned:
            _warned.add(key)
            warnings.warn(f"torch-pjrt: running a graph eagerly (op by op) because it contains {e}, "
                          f"which compiled mode cannot lower yet.", stacklevel=2)
        return make_boxed_func(gm.forward)

    with _lock:
        _graph_counts["graphs_lowered"] += 1

    def run(args):  # boxed calling convention: AOTAutograd passes one list
        inputs = list(args)
        args.clear()  # let inputs be freed as soon as possible
        return prog(*inputs)

    run._boxed_call = True
    run._tp_program = prog
    return run


def _register_fake_kernels():
    """Fake-tensor rules (for tracing) of ops whose PyTorch meta function
    describes another device's kernel: torch._grouped_mm's takes bfloat16 only,
    as CUDA's kernel does, while tpu takes every float dtype.  Other devices
    keep PyTorch's rule (NotImplemented passes them on)."""
    from torch._subclasses import fake_impls

    from ._dispatch import _meta_grouped_mm

    grouped = torch.ops.aten._grouped_mm.default
    if any(getattr(impl, "_tp", False) for _, impl in fake_impls.op_implementations_checks):
        return

    def grouped_mm(fake_mode, func, *args, **kwargs):
        mat_a = args[0] if args else kwargs.get("self")
        if getattr(mat_a, "device", None) is None or mat_a.device.type != "tpu":
            return NotImplemented
        return _meta_grouped_mm(*args, **kwargs)

    grouped_mm._tp = True
    fake_impls.op_implementations_checks.append((lambda func: func is grouped, grouped_mm))

    # Ops whose meta (or fake) rule gives other types than eager mode's
    # kernels, which _dispatch._SPEC_FIX corrects (as the CPU's kernels give
    # them): convolutions lay out their results for the kernel the device
    # would pick (contiguous for PrivateUse1, where the CPU and eager tpu give
    # channels-last results for channels-last inputs); the norms' saved
    # statistics take CUDA's shapes and dtypes.  The rule for tpu tensors
    # applies the same fix, so that graphs hold eager mode's types.  It goes
    # first: PyTorch's convolution rule is found through an earlier entry.
    from torch._subclasses.fake_tensor import FakeTensor

    from ._dispatch import _SPEC_FIX

    fixes = {}
    for name, fix in _SPEC_FIX.items():
        base, _, ovl = name.split("::")[1].partition(".")
        packet = getattr(torch.ops.aten, base, None)
        if packet is not None and hasattr(packet, ovl or "default"):
            fixes[getattr(packet, ovl or "default")] = fix

    def spec_fixed(fake_mode, func, *args, **kwargs):
        vals = _schema_args(func, args, kwargs)
        x = next((v for v in vals if isinstance(v, FakeTensor)), None)
        if x is None or x.fake_device.type != "tpu":
            return NotImplemented
        with fake_impls.in_kernel_invocation_manager(fake_mode):
            out = func(*args, **kwargs)
            outs = list(out) if isinstance(out, tuple) else [out]
            specs = [None if o is None else (tuple(o.shape), tuple(o.stride()), o.dtype) for o in outs]
            fixed = fixes[func](vals, specs)
            outs = [o if o is None else FakeTensor(
                fake_mode, o if new == old else torch.empty_strided(new[0], new[1], dtype=new[2], device="meta"),
                x.fake_device) for o, old, new in zip(outs, specs, fixed)]
        return tuple(outs) if isinstance(out, tuple) else outs[0]

    spec_fixed._tp = True
    fake_impls.op_implementations_checks.insert(0, (fixes.__contains__, spec_fixed))

    # The fused RNN cells without biases (LSTMCell(bias=False)): PyTorch's
    # meta function reads .device of the None biases.  On tpu they are
    # traced through the kernels eager mode runs (_composite).
    cells = {torch.ops.aten._thnn_fused_lstm_cell.default: _composite._lstm_cell,
             torch.ops.aten._thnn_fused_gru_cell.default: _composite._gru_cell}

    def cell_without_bias(fake_mode, func, *args, **kwargs):
        vals = _schema_args(func, args, kwargs)
        if vals[3] is not None or not isinstance(vals[0], FakeTensor) or vals[0].fake_device.type != "tpu":
            return NotImplemented
        with fake_mode:
            return cells[func](*args, **kwargs)

    cell_without_bias._tp = True
    fake_impls.op_implementations_checks.insert(0, (cells.__contains__, cell_without_bias))


def _fftfreq(n, d=1.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    # ATen's fft_fftfreq: arange(n), its upper half replaced by -(n//2)..-1, times 1/(n*d)
    k = torch.arange(n, dtype=torch.int64, device=device)
    k = torch.where(k < (n + 1) // 2, k, k - n).to(dtype or torch.get_default_dtype())
    return k * (1.0 / (n * d))


def _rfftfreq(n, d=1.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return torch.arange(n // 2 + 1, dtype=dtype or torch.get_default_dtype(), device=device) * (1.0 / (n * d))


def _copysign(a, b):
    """copysign in lowered ops (PyTorch's reference uses prims.signbit)."""
    dt = torch.result_type(a, b)
    mag = a.to(dt if dt.is_floating_point else torch.get_default_dtype()).abs()
    if not isinstance(b, torch.Tensor):
        return -mag if math.copysign(1.0, b) < 0 else mag
    return torch.where(torch.signbit(b), -mag, mag)


def _zeta(x, q):
    """special_zeta with a number for one side (PyTorch's reference uses prims.zeta)."""
    like = x if isinstance(x, torch.Tensor) else q
    dt = like.dtype if like.is_floating_point() else torch.get_default_dtype()
    full = lambda v: v.to(dt) if isinstance(v, torch.Tensor) else torch.full_like(like, v, dtype=dt)  # noqa: E731
    return torch.ops.aten.special_zeta.default(full(x), full(q))


def _lcm(a, b):
    """lcm as PyTorch's reference computes it, in lowered ops."""
    dt = a.dtype
    if dt in (torch.int8, torch.int16):  # as the reference: no overflow in between
        a, b = a.to(torch.int32), b.to(torch.int32)
    g = torch.gcd(a, b)
    g = torch.where(g == 0, torch.ones_like(g), g)
    return (torch.div(a, g, rounding_mode="trunc") * b).abs().to(dt)


def _trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """nn.Bilinear's op (a CompositeExplicitAutograd kernel in eager mode) as
    one einsum over the expanded dims, which tracing turns into products:
    never the full broadcast of the three inputs."""
    total = i1.dim() + len(expand1)
    names = [chr(ord("a") + d) for d in range(total)]

    def subs(skip):
        skip = {d % total for d in skip}
        return "".join(names[d] for d in range(total) if d not in skip)

    eq = f"{subs(expand1)},{subs(expand2)},{subs(expand3)}->{subs(sumdim)}"
    return torch.einsum(eq, i1, i2, i3)


@functools.cache  # the same for every graph (0.1-0.4 s to build)
def _decompositions():
    from torch._decomp import core_aten_decompositions, decomposition_table

    table = core_aten_decompositions()
    A = torch.ops.aten
    # Ops eager mode runs through these decompositions (no lowering of their
    # own) that graphs keep whole.
    for op in (A.norm.Scalar, A.norm.ScalarOpt_dim, A.norm.ScalarOpt_dtype, A.norm.ScalarOpt_dim_dtype,
               A.elu.default, A.bucketize.Tensor, A.bucketize.Scalar, A.dist.default, A.ldexp.Tensor,
               A.triu_indices.default, A.tril_indices.default, A.narrow_copy.default, A.unfold.default,
               A.addmm.dtype, A.rrelu_with_noise_backward.default, A.upsample_bicubic2d.default):
        table[op] = decomposition_table[op]
    # The CPU's flash attention (a CPU graph's SDPA) stays whole: PyTorch's
    # decomposition, written for export, returns the attention weights where
    # the op's logsumexp goes, which its backward then reads (wrong gradients).
    table.pop(A._scaled_dot_product_flash_attention_for_cpu.default, None)
    table[A.logcumsumexp.default] = A._logcumsumexp.default
    table[A.copysign.Tensor] = table[A.copysign.Scalar] = _copysign
    table[A.lcm.default] = _lcm
    table[A._trilinear.default] = _trilinear
    table[A.special_zeta.other_scalar] = table[A.special_zeta.self_scalar] = _zeta
    # Factories with a composite kernel in eager mode that graphs keep whole.
    table[torch.ops.aten.fft_fftfreq.default] = _fftfreq
    table[torch.ops.aten.fft_rfftfreq.default] = _rfftfreq
    # The kernels PyTorch has only for CPU/CUDA, written in ATen ops for eager
    # mode, decompose graphs the same way (the MultiheadAttention fast path
    # that a model in eval mode traces, fused optimizers, ...).
    for name, fn in {**_composite.KERNELS, **_attention.KERNELS}.items():
        ns, rest = name.split("::")
        base, _, ovl = rest.partition(".")
        table[getattr(getattr(getattr(torch.ops, ns), base), ovl or "default")] = fn
    return {op: fn for op, fn in table.items() if not _C.has_lowering(_qualname(op))}


def _aot(gm, example_inputs, **kwargs):
    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(fw_compiler=_compile_graph, bw_compiler=_compile_graph,
                           decompositions=_decompositions(), keep_inference_input_mutations=True)
    return backend(gm, example_inputs, **kwargs)


def _symbolic(gm):
    """Whether Dynamo gave the graph symbolic sizes (SymInt inputs)."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("example_value", n.meta.get("val"))
        if isinstance(v, torch.SymInt):
            return True
        if isinstance(v, torch.Tensor) and any(not isinstance(s, int) for s in v.shape):
            return True
    return False


def _item_inputs(gm):
    """Indices of the inputs the graph reads only through .item(): Python
    numbers that Dynamo left unspecialised (dynamic=True passes floats such as
    LayerNorm's eps as 0-d CPU tensors)."""
    found = []
    for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        if n.users and all(u.op == "call_method" and u.target == "item" for u in n.users):
            found.append(i)
    return found


class _Specialize:
    """A graph Dynamo traced with symbolic sizes, run as one static-shape
    compiled graph per set of concrete input sizes (PJRT programs have static
    shapes).  Dynamo recompiles a function whose input sizes changed with
    dynamic sizes unless told dynamic=False; without this every such graph
    would run op by op.  Numbers passed as 0-d tensors and read with .item()
    become constants, one compiled graph per value, as Dynamo's default of
    specialising floats gives."""

    def __init__(self, gm, name, names, kwargs):
        self.gm, self.name, self.names, self.kwargs = gm, name, names, kwargs
        self.items = set(_item_inputs(gm))
        self.cache = {}

    def __call__(self, *args):
        key = (torch.is_grad_enabled(),) + tuple(
            a.item() if i in self.items else
            (tuple(a.shape), a.stride(), a.dtype, a.device, a.requires_grad) if isinstance(a, torch.Tensor)
            else (type(a), a) for i, a in enumerate(args))
        entry = self.cache.get(key)
        if entry is None:
            _note_compile(self.name, list(zip(self.names, args)))
            entry = self.cache[key] = self._specialize(args)
        fn, keep = entry
        return fn(*[args[i] for i in keep])

    def _specialize(self, args):
        """The graph with its size inputs replaced by their values, compiled
        for these inputs; and which inputs it still takes."""
        gm = torch.fx.GraphModule(self.gm, copy.deepcopy(self.gm.graph))
        keep = []
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for i, (n, a) in enumerate(zip(placeholders, args)):
            if i in self.items:
                for item in list(n.users):
                    item.replace_all_uses_with(a.item())
                    gm.graph.erase_node(item)
                gm.graph.erase_node(n)
                continue
            if isinstance(a, torch.Tensor):
                keep.append(i)
                continue
            for user in list(n.users):
                user.args = torch.fx.node.map_arg(user.args, lambda x: a if x is n else x)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda x: a if x is n else x)
            gm.graph.erase_node(n)
        gm.recompile()
        return _aot(gm, [args[i] for i in keep], **self.kwargs), keep


# F.interpolate's upsampling ops have Python decompositions that tracing runs
# (py_impl kernels for Autograd and CompositeImplicitAutograd, which the Python
# dispatcher prefers to our rules).  Their indices are not the CPU kernels'
# where a scale_factor keeps or doubles a dim (the CPU copies a kept dim for
# linear modes and in nearest's backward, resamples it in nearest's forward).
# For tpu tensors, AutogradPrivateUse1 kernels that only tracing sees send the
# .vec forms to the op itself and keep it whole, with its own backward op, so
# graphs run the rules eager mode runs (csrc/core/lower_nn.c).  Bicubic's
# default form has its kernel in _composite.AUTOGRAD.
_UPSAMPLE = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
             "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
             "upsample_trilinear3d")


class _Upsample(torch.autograd.Function):
    """One upsampling op, differentiated with its backward op."""

    @staticmethod
    def forward(ctx, name, x, output_size, *rest):
        ctx.name, ctx.args, ctx.input_size = name, (output_size, *rest), list(x.shape)
        with torch._C._AutoDispatchBelowAutograd():
            return getattr(torch.ops.aten, name).default(x, output_size, *rest)

    @staticmethod
    def backward(ctx, g):
        output_size, *rest = ctx.args
        gx = getattr(torch.ops.aten, ctx.name + "_backward").default(g, output_size, ctx.input_size, *rest)
        return (None, gx) + (None,) * len(ctx.args)

    @staticmethod
    def jvp(ctx, _, x_t, *__):
        return getattr(torch.ops.aten, ctx.name).default(x_t, *ctx.args)


def _upsample_whole(name):
    def kernel(x, output_size, *rest):
        return _Upsample.apply(name, x, list(output_size), *rest)

    return kernel


def _upsample_vec(name):
    """name.vec(input, output_size?, [align_corners,] scale_factors?): sizes
    and scales as ATen's composite computes them, then the op itself."""
    def kernel(x, output_size, *rest):
        from torch._decomp.decompositions import upsample_compute_output_size

        *lead, scale_factors = rest
        osize = upsample_compute_output_size(x.size(), output_size, scale_factors)
        scales = list(scale_factors) if scale_factors else [None] * len(osize)
        return getattr(torch.ops.aten, name).default(x, list(osize), *lead, *scales)

    return kernel


_upsampling_kept = False


def _keep_upsampling_whole():
    global _upsampling_kept
    if _upsampling_kept:
        return
    _upsampling_kept = True
    key = torch._C.DispatchKey.AutogradPrivateUse1
    for name in _UPSAMPLE + ("upsample_bicubic2d",):
        packet = getattr(torch.ops.aten, name)
        kernels = [(packet.vec, _upsample_vec(name))]
        if name in _UPSAMPLE:
            kernels.append((packet.default, _upsample_whole(name)))
        for op, fn in kernels:
            if key not in op.py_kernels:
                op.py_impl(key)(fn)


_skipping = False


def _skip_kernel_frames():
    """Keep Dynamo out of the Python op kernels.  Code that runs eagerly
    inside a compiled function (after a graph break, or a graph run op by
    op) calls them, and Dynamo would trace and compile each kernel as a user
    frame.  Dynamo's skip list is a list of path prefixes (internal API;
    without it the kernels are traced, slowly but correctly).  torch.tpu
    (device.py) is skipped too, as Dynamo skips torch.cuda's Python: its
    functions run eagerly at a graph break (tracing set_rng_state inside
    torch.testing's freeze_rng_state failed in Dynamo's fake-tensor
    conversion)."""
    global _skipping
    if _skipping:
        return
    _skipping = True
    try:
        from torch._dynamo import trace_rules

        from . import _dispatch, device

        trace_rules.SKIP_DIRS.extend(m.__file__ for m in (_dispatch, _composite, _attention, device))
        trace_rules._recompile_re()
    except Exception:
        pass


def tpu_backend(gm, example_inputs, **kwargs):
    """The Dynamo backend registered as "tpu"."""
    _skip_kernel_frames()
    _keep_upsampling_whole()
    name, first = _frame_name(gm)
    if first:
        with _lock:
            _compiles.pop(name, None)
            _last_inputs.pop(name, None)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    if _symbolic(gm) or _item_inputs(gm):
        return _Specialize(gm, name, names, kwargs)
    _note_compile(name, list(zip(names, example_inputs)))
    return _aot(gm, example_inputs, **kwargs)


def _entry_point_installed():
    from importlib.metadata import entry_points

    return any(ep.value == "torch_pjrt._compile:tpu_backend" for ep in entry_points(group="torch_dynamo_backends"))


def _route_default_backend():
    """torch.compile(model) without a backend means Inductor, which cannot
    generate code for the tpu device (it fails with an internal assert).
    Graphs whose inputs are on tpu go to the "tpu" backend instead, with a
    warning once; every other graph still goes to Inductor."""
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None or getattr(wrapper.__call__, "_tp_routed", False):
        return
    inductor_call = wrapper.__call__

    def __call__(self, model_, inputs_, **kwargs):
        if any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in inputs_):
            if not _routed_warned:
                _routed_warned.append(True)
                warnings.warn("torch.compile: Inductor cannot generate code for the tpu device; compiling "
                              "with backend=\"tpu\" instead (pass backend=\"tpu\" to say so).", stacklevel=2)
            return tpu_backend(model_, inputs_)
        return inductor_call(self, model_, inputs_, **kwargs)

    __call__._tp_routed = True
    wrapper.__call__ = __call__


_routed_warned = []


def _hook_torch_compile():
    """At each torch.compile(): keep Dynamo out of the op kernels
    (_skip_kernel_frames) and CPU step counters where they are
    (_keep_cpu_steps).  The skips hold from torch.compile() on, not only
    from the first graph the backend gets: eager code before that graph (a
    random op given a generator, which Dynamo does not trace, at the start
    of a function) was traced through the kernels, and the kernel's meta
    probe, compiled, ran the op on the device: the first call drew twice
    from the generator."""
    for name in ("_TorchCompileWrapper", "_TorchCompileInductorWrapper"):
        cls = getattr(torch, name, None)
        if cls is None or getattr(cls.__init__, "_tp_skips", False):
            continue

        def __init__(self, *args, _init=cls.__init__, **kwargs):
            _init(self, *args, **kwargs)
            _skip_kernel_frames()
            _keep_cpu_steps()

        __init__._tp_skips = True
        cls.__init__ = __init__


def _keep_cpu_steps():
    """Dynamo's compiled optimizers move CPU step counters to the parameter's
    device at each _init_group (OptimizerVariable.move_step_if_cpu), for the
    capturable steps Dynamo turns on for CUDA and XPU parameters.  On tpu no
    group is capturable, and the move only cut the state loose: with two
    parameter groups, the first group's state["step"] became a tpu copy that
    stayed 0 while the graph counted on the CPU tensor it had traced (so a
    saved optimizer state said step 0).  Steps of tpu parameters in groups
    that are not capturable stay on the CPU, as in eager mode."""
    try:
        from torch._dynamo.variables.optimizer import OptimizerVariable
    except Exception:
        return
    move = OptimizerVariable.move_step_if_cpu
    if getattr(move, "_tp_keeps", False):
        return

    def move_step_if_cpu(self):
        group = {id(p): g for g in self.value.param_groups for p in g["params"]}
        keep = [(state, state["step"]) for p, state in self.value.state.items()
                if p.device.type == "tpu" and isinstance(state.get("step"), torch.Tensor) and state["step"].is_cpu
                and not group.get(id(p), {}).get("capturable", False)]
        move(self)
        for state, step in keep:
            state["step"] = step

    move_step_if_cpu._tp_keeps = True
    OptimizerVariable.move_step_if_cpu = move_step_if_cpu


def register():
    """Make "tpu" a torch.compile backend.  With the package's
    `torch_dynamo_backends` entry point (pyproject.toml), Dynamo finds it by itself and
    torch._dynamo is not imported here; otherwise (or when Dynamo is already
    loaded) register it directly."""
    if "torch._dynamo" not in sys.modules and _entry_point_installed():
        return
    from torch._dynamo import register_backend

    _skip_kernel_frames()

    try:
        register_backend(name="tpu")(tpu_backend)
    except Exception:
        pass  # already registered

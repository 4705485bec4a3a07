/* graph.c - whole-graph programs (see graph.h). */
#include "graph.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct gnode {
  char *op;
  tp_lower_fn fn;
  int nargs;
  tp_arg *args; /* owned copies; TENSOR .i / TENSORS .ints hold value ids */
  int nouts;
  tp_type *outs;
  int first; /* id of the first output value */
  int key;   /* id of a random state value (tp::rng_state) the node draws with, or -1: a fresh key */
} gnode;

typedef struct graph {
  int ninputs;
  tp_type *inputs;
  int nvals; /* inputs + all node outputs */
  gnode *nodes;
  int nnodes, capnodes;
  int *outputs;
  int noutputs;
} graph;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static graph **g_graphs; /* index = id - 1; guarded by g_mu */
static int g_cap, g_used;

static void graph_destroy(graph *g) {
  if (!g) return;
  for (int i = 0; i < g->nnodes; i++) {
    gnode *nd = &g->nodes[i];
    for (int j = 0; j < nd->nargs; j++) {
      free((void *)nd->args[j].ints);
      free((void *)nd->args[j].s);
    }
    free(nd->args);
    free(nd->outs);
    free(nd->op);
  }
  free(g->nodes);
  free(g->inputs);
  free(g->outputs);
  free(g);
}

static graph *lookup(int id) {
  graph *g = NULL;
  pthread_mutex_lock(&g_mu);
  if (id >= 1 && id <= g_cap) g = g_graphs[id - 1];
  pthread_mutex_unlock(&g_mu);
  return g;
}

tp_status *tp_graph_new(int ninputs, const tp_type *inputs, int *id) {
  graph *g = calloc(1, sizeof *g);
  if (!g) return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
  g->ninputs = g->nvals = ninputs;
  g->inputs = calloc((size_t)ninputs + 1, sizeof(tp_type));
  if (!g->inputs) {
    free(g);
    return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
  }
  if (ninputs) memcpy(g->inputs, inputs, sizeof(tp_type) * (size_t)ninputs);
  /* Ids are never reused: cached programs are keyed by graph id. */
  pthread_mutex_lock(&g_mu);
  int slot = g_used;
  if (slot == g_cap) {
    int nc = g_cap ? g_cap * 2 : 16;
    graph **ng = realloc(g_graphs, sizeof(graph *) * (size_t)nc);
    if (!ng) {
      pthread_mutex_unlock(&g_mu);
      graph_destroy(g);
      return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
    }
    for (int i = g_cap; i < nc; i++) ng[i] = NULL;
    slot = g_cap;
    g_graphs = ng;
    g_cap = nc;
  }
  g_graphs[slot] = g;
  g_used++;
  pthread_mutex_unlock(&g_mu);
  *id = slot + 1;
  return NULL;
}

void tp_graph_free(int id) {
  pthread_mutex_lock(&g_mu);
  graph *g = NULL;
  if (id >= 1 && id <= g_cap) {
    g = g_graphs[id - 1];
    g_graphs[id - 1] = NULL;
  }
  pthread_mutex_unlock(&g_mu);
  graph_destroy(g);
}

tp_status *tp_graph_add(int id, const char *op, const tp_arg *args, int nargs, const tp_type *outs, int nouts,
                        int key, int *first) {
  graph *g = lookup(id);
  if (!g) return tp_error(TP_INVALID_ARGUMENT, "no graph with id %d", id);
  tp_lower_fn fn = tp_lower_find(op);
  if (!fn) return tp_error(TP_UNIMPLEMENTED, "no lowering for %s", op);
  if (key >= g->nvals) return tp_error(TP_INVALID_ARGUMENT, "%s: the random state refers to unknown value %d", op, key);
  for (int j = 0; j < nargs; j++) {
    if (args[j].kind == TP_ARG_TENSOR && (args[j].i < 0 || args[j].i >= g->nvals))
      return tp_error(TP_INVALID_ARGUMENT, "%s: argument %d refers to unknown value %lld", op, j, (long long)args[j].i);
    if (args[j].kind == TP_ARG_TENSORS)
      for (int k = 0; k < args[j].n; k++)
        if (args[j].ints[k] >= g->nvals)
          return tp_error(TP_INVALID_ARGUMENT, "%s: argument %d refers to unknown value", op, j);
  }
  if (g->nnodes == g->capnodes) {
    int nc = g->capnodes ? g->capnodes * 2 : 32;
    gnode *nn = realloc(g->nodes, sizeof(gnode) * (size_t)nc);
    if (!nn) return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
    g->nodes = nn;
    g->capnodes = nc;
  }
  gnode *nd = &g->nodes[g->nnodes];
  memset(nd, 0, sizeof *nd);
  nd->op = strdup(op);
  nd->fn = fn;
  nd->nargs = nargs;
  nd->args = calloc((size_t)nargs + 1, sizeof(tp_arg));
  nd->nouts = nouts;
  nd->outs = calloc((size_t)nouts + 1, sizeof(tp_type));
  int oom = !nd->op || !nd->args || !nd->outs;
  for (int j = 0; j < nargs && !oom; j++) {
    nd->args[j] = args[j];
    nd->args[j].ints = NULL;
    nd->args[j].s = NULL;
    nd->args[j].vs = NULL;
    if ((args[j].kind == TP_ARG_INTS || args[j].kind == TP_ARG_TENSORS) && args[j].n > 0) {
      int64_t *c = malloc(sizeof(int64_t) * (size_t)args[j].n);
      if (!c) oom = 1;
      else memcpy(c, args[j].ints, sizeof(int64_t) * (size_t)args[j].n);
      nd->args[j].ints = c;
    }
    if (args[j].kind == TP_ARG_STR) {
      nd->args[j].s = strdup(args[j].s ? args[j].s : "");
      if (!nd->args[j].s) oom = 1;
    }
  }
  if (oom) {
    for (int j = 0; j < nargs && nd->args; j++) {
      free((void *)nd->args[j].ints);
      free((void *)nd->args[j].s);
    }
    free(nd->args);
    free(nd->outs);
    free(nd->op);
    return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
  }
  if (nouts) memcpy(nd->outs, outs, sizeof(tp_type) * (size_t)nouts);
  nd->first = g->nvals;
  nd->key = key < 0 ? -1 : key;
  g->nvals += nouts;
  g->nnodes++;
  *first = nd->first;
  return NULL;
}

tp_status *tp_graph_set_outputs(int id, const int *values, int n) {
  graph *g = lookup(id);
  if (!g) return tp_error(TP_INVALID_ARGUMENT, "no graph with id %d", id);
  for (int i = 0; i < n; i++)
    if (values[i] < 0 || values[i] >= g->nvals) return tp_error(TP_INVALID_ARGUMENT, "graph output %d is unknown", i);
  int *o = malloc(sizeof(int) * ((size_t)n + 1));
  if (!o) return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory");
  memcpy(o, values, sizeof(int) * (size_t)n);
  free(g->outputs);
  g->outputs = o;
  g->noutputs = n;
  return NULL;
}

/* The key of a node given a random state (a u8[16] value: seed and counter,
 * the bytes of a tensor<2xui64> key): the same numbers as the node that drew
 * with it (activation checkpointing recomputes a random op in the backward
 * with the forward's state).  Lowering runs under the storage lock. */
static tp_val g_state = -1;
static tp_val state_key(tp_emit *e, const tp_node *n) {
  (void)n;
  int64_t d[2] = {2, 8}, two = 2;
  tp_type t = tp_type_make(TP_U64, 1, &two);
  return em_bitcast(e, em_reshape(e, g_state, 2, d), &t);
}

/* Numbers inside a graph are constants of the graph. */
static tp_val const_scalar(tp_emit *e, const tp_node *n, int i, tp_dtype dt) {
  const tp_arg *a = &n->args[i];
  if (a->fi != 0) return tp_dtype_is_complex(dt) ? em_const_c(e, a->f, a->fi, dt) : tp_scalar_to_real(e, dt);
  int isf = tp_dtype_is_float(a->sdt) || tp_dtype_is_complex(a->sdt);
  return isf ? em_const(e, a->f, dt) : em_const_i(e, a->i, dt);
}

void tp_graph_lower(tp_emit *e, const tp_node *n, tp_val *outs) {
  int id = n->nargs > 0 ? (int)n->args[0].i : 0;
  graph *g = lookup(id);
  if (!g) {
    em_fail(e, TP_INVALID_ARGUMENT, "tp::graph: no graph with id %d (was it freed?)", id);
    return;
  }
  if (n->nargs != g->ninputs + 1) {
    em_fail(e, TP_INVALID_ARGUMENT, "tp::graph: expected %d inputs, got %d", g->ninputs, n->nargs - 1);
    return;
  }
  tp_val *vals = malloc(sizeof(tp_val) * ((size_t)g->nvals + 1));
  if (!vals) {
    em_fail(e, TP_RESOURCE_EXHAUSTED, "out of host memory");
    return;
  }
  for (int i = 0; i < g->ninputs; i++) vals[i] = n->args[1 + i].v;
  for (int k = 0; k < g->nnodes && !em_failed(e); k++) {
    gnode *nd = &g->nodes[k];
    tp_arg *la = calloc((size_t)nd->nargs + 1, sizeof(tp_arg));
    tp_val **lists = calloc((size_t)nd->nargs + 1, sizeof(tp_val *));
    tp_val *ov = calloc((size_t)nd->nouts + 1, sizeof(tp_val));
    if (!la || !lists || !ov) {
      em_fail(e, TP_RESOURCE_EXHAUSTED, "out of host memory");
    } else {
      for (int j = 0; j < nd->nargs; j++) {
        la[j] = nd->args[j];
        if (la[j].kind == TP_ARG_TENSOR) la[j].v = vals[la[j].i];
        if (la[j].kind == TP_ARG_TENSORS) {
          lists[j] = calloc((size_t)la[j].n + 1, sizeof(tp_val));
          if (!lists[j]) {
            em_fail(e, TP_RESOURCE_EXHAUSTED, "out of host memory");
            break;
          }
          for (int q = 0; q < la[j].n; q++) lists[j][q] = la[j].ints[q] < 0 ? -1 : vals[la[j].ints[q]];
          la[j].vs = lists[j];
        }
      }
      for (int q = 0; q < nd->nouts; q++) ov[q] = -1;
      tp_node sub = {nd->op, nd->nargs, la, nd->nouts, nd->outs, n->ctx, const_scalar, n->rng_key, n->check, NULL, NULL};
      if (nd->key >= 0) {
        g_state = vals[nd->key];
        sub.rng_key = state_key;
      }
      tp_lower_run(nd->fn, e, &sub, ov);
      g_state = -1;
      for (int q = 0; q < nd->nouts && !em_failed(e); q++) {
        if (ov[q] < 0) {
          em_fail(e, TP_INTERNAL, "lowering of %s produced no value for output %d", nd->op, q);
          break;
        }
        const tp_type *vt = em_type(e, ov[q]);
        int same = vt->rank == nd->outs[q].rank;
        for (int d = 0; same && d < vt->rank; d++) same = vt->dims[d] == nd->outs[q].dims[d];
        if (!same) {
          em_fail(e, TP_INTERNAL, "lowering of %s produced a value of the wrong shape for output %d", nd->op, q);
          break;
        }
        vals[nd->first + q] = em_convert(e, ov[q], nd->outs[q].dt);
      }
    }
    if (lists)
      for (int j = 0; j < nd->nargs; j++) free(lists[j]);
    free(lists);
    free(la);
    free(ov);
  }
  for (int i = 0; i < n->nouts && i < g->noutputs; i++) outs[i] = vals[g->outputs[i]];
  if (n->nouts != g->noutputs && !em_failed(e))
    em_fail(e, TP_INVALID_ARGUMENT, "tp::graph: %d outputs requested, graph has %d", n->nouts, g->noutputs);
  free(vals);
}

/* graph.h - whole-graph programs for compiled mode.
 *
 * A graph is a list of ATen op nodes over SSA values: values 0..ninputs-1
 * are the graph's tensor inputs, every node appends its outputs.  Lowering a
 * graph calls the same rules (lower.h) node by node, so eager and compiled
 * mode share one lowering table.  A registered graph runs through the eager
 * engine as the pseudo-op "tp::graph" whose first argument is the graph id
 * and whose other arguments are the input tensors: the engine supplies
 * storage handling, views, the program cache and execution.
 *
 * Python numbers inside a graph are constants of that graph (they are part
 * of the traced program), not runtime parameters.
 */
#ifndef TP_GRAPH_H
#define TP_GRAPH_H

#include "lower.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A new graph with `ninputs` tensor inputs of the given types; returns its
 * id (> 0) or a status. */
tp_status *tp_graph_new(int ninputs, const tp_type *inputs, int *id);
/* Append a node.  Tensor arguments are TP_ARG_TENSOR with .i = value id;
 * list entries are value ids in .ints (-1 for None) for TP_ARG_TENSORS.
 * key >= 0: the id of a random state value (see tp::rng_state) the node's
 * random numbers come from instead of a fresh key (-1).
 * Writes the id of the node's first output value to *first. */
tp_status *tp_graph_add(int id, const char *op, const tp_arg *args, int nargs, const tp_type *outs, int nouts,
                        int key, int *first);
tp_status *tp_graph_set_outputs(int id, const int *values, int n);
void tp_graph_free(int id);

/* The rule behind "tp::graph" (used by lower.c). */
void tp_graph_lower(tp_emit *e, const tp_node *n, tp_val *outs);

#ifdef __cplusplus
}
#endif
#endif

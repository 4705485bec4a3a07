/* lower_shape.c - lowering rules (see lower.h). */
#include "lower_util.h"

const tp_lower_entry tp_lower_shape[] = {
    {NULL, NULL},
};

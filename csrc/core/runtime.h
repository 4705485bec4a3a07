/* runtime.h - the process-wide device runtime.
 *
 * One plugin and its client per process, opened on first use.  The runtime
 * owns per-device state (RNG seeds) and the program cache.  All functions
 * are thread-safe; the runtime's state is guarded by its own mutex.
 */
#ifndef TP_RUNTIME_H
#define TP_RUNTIME_H

#include <stdint.h>

#include "pjrt.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_runtime_config {
  const char *plugin_path; /* NULL: the default given to tp_runtime_init */
  int cpu_device_count;    /* <= 0: 1 */
} tp_runtime_config;

/* Open the plugin (idempotent: a second call with the runtime already open
 * returns success).  On failure nothing is kept and a later call may try
 * again; the error names the plugin file. */
tp_status *tp_runtime_init(const tp_runtime_config *cfg);
/* Return freed host memory the allocator keeps for reuse to the system
 * (torch.tpu.empty_cache(); see tune_host_malloc in runtime.c). */
void tp_runtime_release_host_memory(void);
/* The open plugin, or NULL before a successful tp_runtime_init. */
tp_plugin *tp_runtime_plugin(void);
/* Number of devices; 0 before tp_runtime_init succeeded. */
int tp_runtime_device_count(void);
/* Bytes a device can hold: its memory where the plugin reports it, else the
 * host's physical memory; 0 if unknown. */
int64_t tp_runtime_device_capacity(int device);

/* Per-device random state: a 64-bit seed and a counter that advances with
 * every random op, so results are reproducible for a given seed. */
void tp_runtime_manual_seed(int device, uint64_t seed);
uint64_t tp_runtime_initial_seed(int device);
/* Reserve `n` counter values; returns (seed, first counter). */
void tp_runtime_rng_advance(int device, uint64_t n, uint64_t *seed,
                            uint64_t *offset);

#ifdef __cplusplus
}
#endif
#endif

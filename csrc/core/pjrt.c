/* pjrt.c - the PJRT boundary (see pjrt.h), written against pjrt_c_api.h.
 *
 * Rules followed throughout:
 *  - every *_Args struct is zeroed and carries the header's *_STRUCT_SIZE;
 *  - a function-table slot is only called if it lies inside the plugin's
 *    own PJRT_Api.struct_size and is non-NULL (else TP_UNIMPLEMENTED);
 *  - every PJRT_Error is turned into a tp_status and destroyed, every
 *    PJRT_Event is destroyed;
 *  - nothing aborts: bad input and allocation failures come back as status.
 */
#include "pjrt.h"
#include "trace.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <pjrt_c_api.h>

/* ---- plugin state --------------------------------------------------------- */

struct tp_plugin {
  char *path;
  const PJRT_Api *api;
  PJRT_Client *client;
  char api_version[32];  /* "major.minor" */
  char xla_version[64];  /* "" if the plugin does not say */
  char *platform;        /* e.g. "cpu" */
  int num_devices;
  PJRT_Device **devices; /* addressable devices, index = our device id */
  char **device_kinds;
  pthread_mutex_t mem_lock; /* guards mem[] */
  tp_mem_stats *mem;        /* one per device */
  unsigned fork_gen;        /* g_fork_generation when the client was made */
  struct reaper *reaper;    /* destroys freed buffers; see tp_buffer_free */
};

struct tp_buffer {
  tp_plugin *p;
  PJRT_Buffer *buf;
  struct tp_buffer *next; /* in the reaper's queue */
  tp_dtype dtype;
  int device;
  int ndim;
  int64_t dims[TP_MAX_RANK];
  int64_t numel;
  size_t nbytes;
};

struct tp_exec {
  tp_plugin *p;
  PJRT_LoadedExecutable *exe;
  int num_outputs;
  int64_t out_bytes; /* the outputs' total size; -1 if the plugin does not say */
  char name[96];     /* what its trace events are called */
};

/* ---- function-table slots ------------------------------------------------- */

/* True if the plugin's table is long enough to contain `fn` and sets it.
 * A plugin built against an older header has a shorter table; reading past
 * its struct_size would read unrelated memory. */
#define HAS_SLOT(api, fn)                                              \
  ((api)->struct_size >= offsetof(PJRT_Api, fn) + sizeof((api)->fn) && \
   (api)->fn != NULL)

#define REQUIRE_SLOT(p, fn)                                  \
  do {                                                       \
    if (!HAS_SLOT((p)->api, fn)) return missing_slot(p, #fn); \
  } while (0)

static tp_status *missing_slot(const tp_plugin *p, const char *name) {
  return tp_error(TP_UNIMPLEMENTED,
                  "PJRT plugin %s (C API %s) does not provide %s", p->path,
                  p->api_version, name);
}

/* ---- errors and events ---------------------------------------------------- */

static tp_code code_from_pjrt(PJRT_Error_Code c) {
  switch (c) {
    case PJRT_Error_Code_INVALID_ARGUMENT: return TP_INVALID_ARGUMENT;
    case PJRT_Error_Code_NOT_FOUND: return TP_NOT_FOUND;
    case PJRT_Error_Code_UNIMPLEMENTED: return TP_UNIMPLEMENTED;
    case PJRT_Error_Code_RESOURCE_EXHAUSTED: return TP_RESOURCE_EXHAUSTED;
    case PJRT_Error_Code_FAILED_PRECONDITION: return TP_FAILED_PRECONDITION;
    case PJRT_Error_Code_OUT_OF_RANGE: return TP_OUT_OF_RANGE;
    default: return TP_INTERNAL;
  }
}

static void destroy_error(const PJRT_Api *api, PJRT_Error *err) {
  if (!err) return;
  PJRT_Error_Destroy_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE;
  a.error = err;
  api->PJRT_Error_Destroy(&a);
}

static PJRT_Error_Code error_code(const PJRT_Api *api, PJRT_Error *err) {
  if (!HAS_SLOT(api, PJRT_Error_GetCode)) return PJRT_Error_Code_UNKNOWN;
  PJRT_Error_GetCode_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Error_GetCode_Args_STRUCT_SIZE;
  a.error = err;
  PJRT_Error *e2 = api->PJRT_Error_GetCode(&a);
  if (e2) {
    destroy_error(api, e2);
    return PJRT_Error_Code_UNKNOWN;
  }
  return a.code;
}

/* Convert (and destroy) a PJRT_Error.  NULL in, NULL out.  The message is
 * "<what>: <plugin's message>". */
static tp_status *from_pjrt(const PJRT_Api *api, PJRT_Error *err,
                            const char *what) {
  if (!err) return NULL;
  tp_code code = code_from_pjrt(error_code(api, err));
  PJRT_Error_Message_Args m;
  memset(&m, 0, sizeof m);
  m.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE;
  m.error = err;
  api->PJRT_Error_Message(&m);
  const char *msg = m.message ? m.message : "(no message)";
  int len = m.message ? (int)m.message_size : (int)strlen(msg);
  tp_status *st = tp_error(code, "%s: %.*s", what, len, msg);
  destroy_error(api, err);
  return st;
}

static void destroy_event(const PJRT_Api *api, PJRT_Event *ev) {
  if (!ev) return;
  PJRT_Event_Destroy_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
  a.event = ev;
  destroy_error(api, api->PJRT_Event_Destroy(&a));
}

/* Block on `ev`, destroy it, and return its error (if any) as a status. */
static tp_status *await_event(const PJRT_Api *api, PJRT_Event *ev,
                              const char *what) {
  if (!ev) return NULL;
  PJRT_Event_Await_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE;
  a.event = ev;
  tp_status *st = from_pjrt(api, api->PJRT_Event_Await(&a), what);
  destroy_event(api, ev);
  return st;
}

static char *copy_string(const char *s, size_t n) {
  char *c = malloc(n + 1);
  if (!c) return NULL;
  if (n) memcpy(c, s, n);
  c[n] = '\0';
  return c;
}

static tp_status *out_of_memory(const char *what) {
  return tp_error(TP_RESOURCE_EXHAUSTED, "out of host memory while %s", what);
}

/* ---- loading -------------------------------------------------------------- */

/* dlopen the file and return its PJRT_Api.  Never dlclose'd once it is known
 * to be a plugin: PJRT plugins do not support unloading. */
static tp_status *open_plugin_api(const char *path, const PJRT_Api **out) {
  struct stat sb;
  if (stat(path, &sb) != 0)
    return tp_error(errno == ENOENT ? TP_NOT_FOUND : TP_INVALID_ARGUMENT,
                    "PJRT plugin %s cannot be read: %s", path,
                    strerror(errno));
  /* RTLD_LOCAL keeps the plugin's symbols (LLVM, protobuf, absl) from
   * meeting PyTorch's.  No RTLD_DEEPBIND: AddressSanitizer rejects it and
   * the XLA plugin exports nothing but GetPjrtApi anyway. */
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    return tp_error(TP_INVALID_ARGUMENT,
                    "PJRT plugin %s is not a loadable shared object: %s", path,
                    why ? why : "unknown dlopen error");
  }
  dlerror();
  typedef const PJRT_Api *(*get_api_fn)(void);
  get_api_fn get_api = (get_api_fn)dlsym(h, "GetPjrtApi");
  if (!get_api) {
    const char *why = dlerror();
    tp_status *st =
        tp_error(TP_NOT_FOUND,
                 "%s is not a PJRT plugin: symbol GetPjrtApi not found (%s)",
                 path, why ? why : "no dlerror text");
    dlclose(h); /* not a plugin, safe to unload */
    return st;
  }
  const PJRT_Api *api = get_api();
  if (!api)
    return tp_error(TP_INTERNAL, "GetPjrtApi in PJRT plugin %s returned NULL",
                    path);
  *out = api;
  return NULL;
}

/* The plugin's table must have the current major version and contain the
 * slots every later call relies on. */
static tp_status *check_api(const char *path, const PJRT_Api *api) {
  if (api->struct_size <
      offsetof(PJRT_Api, pjrt_api_version) + sizeof(PJRT_Api_Version))
    return tp_error(TP_FAILED_PRECONDITION,
                    "PJRT plugin %s has a truncated function table "
                    "(struct_size %zu)",
                    path, api->struct_size);
  int major = api->pjrt_api_version.major_version;
  int minor = api->pjrt_api_version.minor_version;
  if (major != PJRT_API_MAJOR)
    return tp_error(TP_FAILED_PRECONDITION,
                    "PJRT plugin %s has C API version %d.%d, but torch-pjrt "
                    "was built for major version %d (header %d.%d)",
                    path, major, minor, PJRT_API_MAJOR, PJRT_API_MAJOR,
                    PJRT_API_MINOR);
  /* Without these we could not even report an error. */
  if (!HAS_SLOT(api, PJRT_Error_Destroy) || !HAS_SLOT(api, PJRT_Error_Message))
    return tp_error(TP_FAILED_PRECONDITION,
                    "PJRT plugin %s (C API %d.%d) lacks PJRT_Error_Destroy or "
                    "PJRT_Error_Message",
                    path, major, minor);
  const char *missing = NULL;
#define NEED(fn) \
  if (!missing && !HAS_SLOT(api, fn)) missing = #fn
  NEED(PJRT_Plugin_Initialize);
  NEED(PJRT_Event_Destroy);
  NEED(PJRT_Event_Await);
  NEED(PJRT_Client_Create);
  NEED(PJRT_Client_Destroy);
  NEED(PJRT_Client_PlatformName);
  NEED(PJRT_Client_AddressableDevices);
  NEED(PJRT_Buffer_Destroy);
  NEED(PJRT_LoadedExecutable_Destroy);
#undef NEED
  if (missing)
    return tp_error(TP_FAILED_PRECONDITION,
                    "PJRT plugin %s (C API %d.%d) lacks required function %s",
                    path, major, minor, missing);
  return NULL;
}

/* PJRT_Plugin_Initialize must run once per loaded plugin, before anything
 * else.  Loading the same file twice returns the same table, so remember
 * which tables were initialized. */
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;

/* Bumped in every forked child (pthread_atfork): a client made before the
 * fork belongs to the parent.  An atomic load is cheaper than getpid(), a
 * system call, on every execute and free. */
static atomic_uint g_fork_generation;
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;
static void on_fork_child(void) { atomic_fetch_add(&g_fork_generation, 1); }
static void install_atfork(void) { pthread_atfork(NULL, NULL, on_fork_child); }
static const PJRT_Api *g_initialized[16];
static int g_num_initialized;

static tp_status *initialize_plugin(const char *path, const PJRT_Api *api) {
  pthread_mutex_lock(&g_init_lock);
  for (int i = 0; i < g_num_initialized; i++)
    if (g_initialized[i] == api) {
      pthread_mutex_unlock(&g_init_lock);
      return NULL;
    }
  PJRT_Plugin_Initialize_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Plugin_Initialize_Args_STRUCT_SIZE;
  tp_status *st = from_pjrt(api, api->PJRT_Plugin_Initialize(&a),
                            "PJRT_Plugin_Initialize");
  if (!st && g_num_initialized < (int)(sizeof g_initialized / sizeof g_initialized[0]))
    g_initialized[g_num_initialized++] = api;
  pthread_mutex_unlock(&g_init_lock);
  return tp_error_wrap(st, "initializing PJRT plugin %s", path);
}

/* Fill p->xla_version from the plugin attributes (left "" if absent). */
static tp_status *read_attributes(tp_plugin *p) {
  p->xla_version[0] = '\0';
  if (!HAS_SLOT(p->api, PJRT_Plugin_Attributes)) return NULL;
  PJRT_Plugin_Attributes_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Plugin_Attributes_Args_STRUCT_SIZE;
  TP_RETURN_IF_ERROR(from_pjrt(p->api, p->api->PJRT_Plugin_Attributes(&a),
                               "PJRT_Plugin_Attributes"));
  for (size_t i = 0; i < a.num_attributes; i++) {
    const PJRT_NamedValue *nv = &a.attributes[i];
    if (nv->name_size != strlen("xla_version") ||
        memcmp(nv->name, "xla_version", nv->name_size) != 0)
      continue;
    /* This plugin reports an int64; others might use a string. */
    if (nv->type == PJRT_NamedValue_kInt64)
      snprintf(p->xla_version, sizeof p->xla_version, "%lld",
               (long long)nv->int64_value);
    else if (nv->type == PJRT_NamedValue_kString)
      snprintf(p->xla_version, sizeof p->xla_version, "%.*s",
               (int)nv->value_size, nv->string_value);
  }
  return NULL;
}

static void destroy_client(const PJRT_Api *api, PJRT_Client *client) {
  if (!client) return;
  PJRT_Client_Destroy_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE;
  a.client = client;
  destroy_error(api, api->PJRT_Client_Destroy(&a));
}

static tp_status *create_client(const PJRT_Api *api,
                                const PJRT_NamedValue *options,
                                size_t num_options, PJRT_Client **out) {
  PJRT_Client_Create_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE;
  a.create_options = options;
  a.num_options = num_options;
  TP_RETURN_IF_ERROR(
      from_pjrt(api, api->PJRT_Client_Create(&a), "PJRT_Client_Create"));
  *out = a.client;
  return NULL;
}

static tp_status *read_platform(tp_plugin *p) {
  PJRT_Client_PlatformName_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Client_PlatformName_Args_STRUCT_SIZE;
  a.client = p->client;
  TP_RETURN_IF_ERROR(from_pjrt(p->api, p->api->PJRT_Client_PlatformName(&a),
                               "PJRT_Client_PlatformName"));
  free(p->platform);
  p->platform = copy_string(a.platform_name ? a.platform_name : "",
                            a.platform_name ? a.platform_name_size : 0);
  return p->platform ? NULL : out_of_memory("reading the platform name");
}

static tp_status *count_devices(const tp_plugin *p, size_t *n,
                                PJRT_Device *const **list) {
  PJRT_Client_AddressableDevices_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Client_AddressableDevices_Args_STRUCT_SIZE;
  a.client = p->client;
  TP_RETURN_IF_ERROR(
      from_pjrt(p->api, p->api->PJRT_Client_AddressableDevices(&a),
                "PJRT_Client_AddressableDevices"));
  *n = a.num_addressable_devices;
  *list = a.addressable_devices;
  return NULL;
}

/* The XLA CPU plugin decides its device count at client creation, from the
 * named value "cpu_device_count" (int64; default 4).  Other plugins may
 * reject names they do not know, so the option is only passed once the
 * platform is known to be "cpu": create a plain client, and if it is a CPU
 * client with the wrong device count, create it again with the option.
 *
 * Measured on xla-cpu-pjrt (C API 0.81): "cpu_device_count" is honoured;
 * "asynchronous" and any other name are silently ignored (the client is
 * always asynchronous), so tp_plugin_options.asynchronous is not passed. */
static tp_status *create_configured_client(tp_plugin *p,
                                           const tp_plugin_options *opts) {
  TP_RETURN_IF_ERROR(create_client(p->api, NULL, 0, &p->client));
  TP_RETURN_IF_ERROR(read_platform(p));
  if (!tp_plugin_is_cpu(p)) return NULL;

  int64_t want = opts && opts->cpu_device_count > 0 ? opts->cpu_device_count : 1;
  size_t have = 0;
  PJRT_Device *const *list = NULL;
  TP_RETURN_IF_ERROR(count_devices(p, &have, &list));
  if ((int64_t)have == want) return NULL;

  destroy_client(p->api, p->client);
  p->client = NULL;
  PJRT_NamedValue nv;
  memset(&nv, 0, sizeof nv);
  nv.struct_size = PJRT_NamedValue_STRUCT_SIZE;
  nv.name = "cpu_device_count";
  nv.name_size = strlen(nv.name);
  nv.type = PJRT_NamedValue_kInt64;
  nv.int64_value = want;
  nv.value_size = 1;
  TP_RETURN_IF_ERROR(create_client(p->api, &nv, 1, &p->client));
  return read_platform(p);
}

static tp_status *read_device_kind(tp_plugin *p, PJRT_Device *dev,
                                   char **out) {
  const char *kind = "";
  size_t len = 0;
  if (HAS_SLOT(p->api, PJRT_Device_GetDescription) &&
      HAS_SLOT(p->api, PJRT_DeviceDescription_Kind)) {
    PJRT_Device_GetDescription_Args d;
    memset(&d, 0, sizeof d);
    d.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE;
    d.device = dev;
    TP_RETURN_IF_ERROR(from_pjrt(p->api, p->api->PJRT_Device_GetDescription(&d),
                                 "PJRT_Device_GetDescription"));
    PJRT_DeviceDescription_Kind_Args k;
    memset(&k, 0, sizeof k);
    k.struct_size = PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE;
    k.device_description = d.device_description;
    TP_RETURN_IF_ERROR(from_pjrt(p->api,
                                 p->api->PJRT_DeviceDescription_Kind(&k),
                                 "PJRT_DeviceDescription_Kind"));
    if (k.device_kind) {
      kind = k.device_kind;
      len = k.device_kind_size;
    }
  }
  *out = copy_string(kind, len);
  return *out ? NULL : out_of_memory("reading device kinds");
}

static tp_status *read_devices(tp_plugin *p) {
  size_t n = 0;
  PJRT_Device *const *list = NULL;
  TP_RETURN_IF_ERROR(count_devices(p, &n, &list));
  if (n == 0)
    return tp_error(TP_FAILED_PRECONDITION,
                    "PJRT plugin %s reports no addressable devices", p->path);
  p->devices = calloc(n, sizeof *p->devices);
  p->device_kinds = calloc(n, sizeof *p->device_kinds);
  p->mem = calloc(n, sizeof *p->mem);
  if (!p->devices || !p->device_kinds || !p->mem)
    return out_of_memory("listing devices");
  p->num_devices = (int)n;
  for (size_t i = 0; i < n; i++) {
    p->mem[i].bytes_limit = -1;
    p->devices[i] = list[i];
    TP_RETURN_IF_ERROR(read_device_kind(p, list[i], &p->device_kinds[i]));
  }
  return NULL;
}

static void reaper_start(tp_plugin *p);
static void reaper_stop(tp_plugin *p);
static bool in_forked_child(const tp_plugin *p);

static void plugin_free(tp_plugin *p) {
  if (!p) return;
  if (!in_forked_child(p)) { /* a child has neither the thread nor the client */
    reaper_stop(p);
    if (p->client) destroy_client(p->api, p->client);
  }
  if (p->device_kinds)
    for (int i = 0; i < p->num_devices; i++) free(p->device_kinds[i]);
  free(p->device_kinds);
  free(p->devices);
  free(p->mem);
  free(p->platform);
  free(p->path);
  pthread_mutex_destroy(&p->mem_lock);
  free(p);
}

tp_status *tp_plugin_load(const char *path, const tp_plugin_options *opts,
                          tp_plugin **out) {
  if (!path || !out)
    return tp_error(TP_INVALID_ARGUMENT, "tp_plugin_load: NULL %s",
                    !path ? "path" : "out");
  *out = NULL;
  const PJRT_Api *api = NULL;
  TP_RETURN_IF_ERROR(open_plugin_api(path, &api));
  TP_RETURN_IF_ERROR(check_api(path, api));
  TP_RETURN_IF_ERROR(initialize_plugin(path, api));

  tp_plugin *p = calloc(1, sizeof *p);
  if (!p) return out_of_memory("loading a PJRT plugin");
  pthread_mutex_init(&p->mem_lock, NULL);
  pthread_once(&g_atfork_once, install_atfork);
  p->fork_gen = atomic_load(&g_fork_generation);
  p->api = api;
  p->path = copy_string(path, strlen(path));
  if (!p->path) {
    plugin_free(p);
    return out_of_memory("loading a PJRT plugin");
  }
  snprintf(p->api_version, sizeof p->api_version, "%d.%d",
           api->pjrt_api_version.major_version,
           api->pjrt_api_version.minor_version);

  tp_status *st = read_attributes(p);
  if (!st) st = create_configured_client(p, opts);
  if (!st) st = read_devices(p);
  if (!st) reaper_start(p);
  if (st) {
    plugin_free(p);
    return tp_error_wrap(st, "loading PJRT plugin %s", path);
  }
  *out = p;
  return NULL;
}

void tp_plugin_destroy(tp_plugin *p) { plugin_free(p); }

int tp_plugin_device_count(const tp_plugin *p) { return p ? p->num_devices : 0; }
const char *tp_plugin_path(const tp_plugin *p) { return p ? p->path : ""; }
const char *tp_plugin_platform(const tp_plugin *p) {
  return p && p->platform ? p->platform : "";
}
bool tp_plugin_is_cpu(const tp_plugin *p) {
  return strcmp(tp_plugin_platform(p), "cpu") == 0;
}
const char *tp_plugin_xla_version(const tp_plugin *p) {
  return p ? p->xla_version : "";
}
const char *tp_plugin_api_version(const tp_plugin *p) {
  return p ? p->api_version : "";
}
const char *tp_plugin_device_kind(const tp_plugin *p, int i) {
  if (!p || i < 0 || i >= p->num_devices) return "";
  return p->device_kinds[i];
}

static tp_status *check_device(const tp_plugin *p, int device,
                               const char *what) {
  if (device < 0 || device >= p->num_devices)
    return tp_error(TP_OUT_OF_RANGE,
                    "%s: device index %d out of range (plugin has %d devices)",
                    what, device, p->num_devices);
  return NULL;
}

/* A forked child shares the parent's client but not its threads: any use of
 * it would hang or crash.  (Freeing is handled in tp_buffer_free.) */
static bool in_forked_child(const tp_plugin *p) {
  return atomic_load_explicit(&g_fork_generation, memory_order_relaxed) != p->fork_gen;
}

static tp_status *check_process(const tp_plugin *p) {
  if (!in_forked_child(p)) return NULL;
  return tp_error(TP_FAILED_PRECONDITION,
                  "the tpu runtime cannot be used in a forked subprocess (its "
                  "PJRT client belongs to the parent). To use tpu tensors with "
                  "multiprocessing, use the 'spawn' start method, e.g. "
                  "torch.multiprocessing.set_start_method('spawn'), or "
                  "DataLoader(multiprocessing_context='spawn')");
}

/* ---- memory accounting ---------------------------------------------------- */

static void mem_add(tp_plugin *p, int device, size_t nbytes) {
  pthread_mutex_lock(&p->mem_lock);
  tp_mem_stats *m = &p->mem[device];
  m->bytes_in_use += (int64_t)nbytes;
  m->live_buffers += 1;
  if (m->bytes_in_use > m->peak_bytes) m->peak_bytes = m->bytes_in_use;
  pthread_mutex_unlock(&p->mem_lock);
}

static void mem_sub(tp_plugin *p, int device, size_t nbytes) {
  pthread_mutex_lock(&p->mem_lock);
  tp_mem_stats *m = &p->mem[device];
  m->bytes_in_use -= (int64_t)nbytes;
  m->live_buffers -= 1;
  pthread_mutex_unlock(&p->mem_lock);
}

/* An error if `nbytes` more on `device` would pass its limit. */
static tp_status *mem_check(tp_plugin *p, int device, int64_t nbytes) {
  pthread_mutex_lock(&p->mem_lock);
  tp_mem_stats m = p->mem[device];
  pthread_mutex_unlock(&p->mem_lock);
  if (m.bytes_limit < 0 || nbytes <= 0 || m.bytes_in_use + nbytes <= m.bytes_limit) return NULL;
  const double mib = 1024.0 * 1024.0;
  return tp_error(TP_RESOURCE_EXHAUSTED,
                  "out of memory on device %d: tried to allocate %.2f MiB with %.2f MiB in use, over the "
                  "per-process limit of %.2f MiB (torch.tpu.set_per_process_memory_fraction)",
                  device, (double)nbytes / mib, (double)m.bytes_in_use / mib, (double)m.bytes_limit / mib);
}

tp_status *tp_plugin_set_mem_limit(tp_plugin *p, int device, int64_t bytes) {
  if (!p) return tp_error(TP_INVALID_ARGUMENT, "tp_plugin_set_mem_limit: NULL plugin");
  TP_RETURN_IF_ERROR(check_device(p, device, "tp_plugin_set_mem_limit"));
  pthread_mutex_lock(&p->mem_lock);
  p->mem[device].bytes_limit = bytes < 0 ? -1 : bytes;
  pthread_mutex_unlock(&p->mem_lock);
  return NULL;
}

tp_status *tp_plugin_mem_stats(tp_plugin *p, int device, tp_mem_stats *out) {
  if (!p || !out)
    return tp_error(TP_INVALID_ARGUMENT, "tp_plugin_mem_stats: NULL argument");
  TP_RETURN_IF_ERROR(check_device(p, device, "tp_plugin_mem_stats"));
  pthread_mutex_lock(&p->mem_lock);
  *out = p->mem[device];
  pthread_mutex_unlock(&p->mem_lock);
  return NULL;
}

tp_status *tp_plugin_reset_peak(tp_plugin *p, int device) {
  if (!p)
    return tp_error(TP_INVALID_ARGUMENT, "tp_plugin_reset_peak: NULL plugin");
  TP_RETURN_IF_ERROR(check_device(p, device, "tp_plugin_reset_peak"));
  pthread_mutex_lock(&p->mem_lock);
  p->mem[device].peak_bytes = p->mem[device].bytes_in_use;
  pthread_mutex_unlock(&p->mem_lock);
  return NULL;
}

tp_status *tp_plugin_device_memory(tp_plugin *p, int device, int64_t *total,
                                   int64_t *free_bytes) {
  if (!p || !total || !free_bytes)
    return tp_error(TP_INVALID_ARGUMENT,
                    "tp_plugin_device_memory: NULL argument");
  TP_RETURN_IF_ERROR(check_device(p, device, "tp_plugin_device_memory"));
  REQUIRE_SLOT(p, PJRT_Device_MemoryStats);
  PJRT_Device_MemoryStats_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Device_MemoryStats_Args_STRUCT_SIZE;
  a.device = p->devices[device];
  TP_RETURN_IF_ERROR(from_pjrt(p->api, p->api->PJRT_Device_MemoryStats(&a),
                               "PJRT_Device_MemoryStats"));
  if (!a.bytes_limit_is_set)
    return tp_error(TP_UNIMPLEMENTED,
                    "PJRT plugin %s reports no memory limit for device %d",
                    p->path, device);
  *total = a.bytes_limit;
  *free_bytes = a.bytes_limit - a.bytes_in_use;
  return NULL;
}

/* ---- buffers -------------------------------------------------------------- */

/* Validate a shape and compute its element count. */
static tp_status *shape_numel(const int64_t *dims, int ndim, int64_t *numel) {
  if (ndim < 0 || ndim > TP_MAX_RANK)
    return tp_error(TP_INVALID_ARGUMENT, "rank %d is outside [0, %d]", ndim,
                    TP_MAX_RANK);
  if (ndim > 0 && !dims)
    return tp_error(TP_INVALID_ARGUMENT, "NULL dims for rank %d", ndim);
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (dims[i] < 0)
      return tp_error(TP_INVALID_ARGUMENT, "negative dimension %lld at %d",
                      (long long)dims[i], i);
    if (dims[i] != 0 && n > INT64_MAX / dims[i])
      return tp_error(TP_INVALID_ARGUMENT, "shape has too many elements");
    n *= dims[i];
  }
  *numel = n;
  return NULL;
}

/* Destroy a PJRT buffer we have not wrapped (yet). */
static void destroy_pjrt_buffer(const PJRT_Api *api, PJRT_Buffer *pb) {
  if (!pb) return;
  PJRT_Buffer_Destroy_Args d;
  memset(&d, 0, sizeof d);
  d.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE;
  d.buffer = pb;
  destroy_error(api, api->PJRT_Buffer_Destroy(&d));
}

/* Byte size of a dense array, or an error if the dtype or shape is bad. */
static tp_status *dense_size(tp_dtype dt, const int64_t *dims, int ndim,
                             int64_t *numel, size_t *nbytes) {
  TP_RETURN_IF_ERROR(shape_numel(dims, ndim, numel));
  size_t esize = tp_dtype_size(dt);
  if (esize == 0)
    return tp_error(TP_INVALID_ARGUMENT, "unsupported dtype %d", (int)dt);
  if ((uint64_t)*numel > SIZE_MAX / esize)
    return tp_error(TP_INVALID_ARGUMENT, "buffer size overflows size_t");
  *nbytes = (size_t)*numel * esize;
  return NULL;
}

/* Take ownership of `pb` in a new tp_buffer (destroying `pb` on failure). */
static tp_status *buffer_wrap(tp_plugin *p, PJRT_Buffer *pb, int device,
                              tp_dtype dt, const int64_t *dims, int ndim,
                              tp_buffer **out) {
  int64_t numel = 0;
  size_t nbytes = 0;
  tp_status *st = dense_size(dt, dims, ndim, &numel, &nbytes);
  if (st) {
    destroy_pjrt_buffer(p->api, pb);
    return st;
  }
  tp_buffer *b = calloc(1, sizeof *b);
  if (!b) {
    destroy_pjrt_buffer(p->api, pb);
    return out_of_memory("creating a buffer");
  }
  b->p = p;
  b->buf = pb;
  b->dtype = dt;
  b->device = device;
  b->ndim = ndim;
  for (int i = 0; i < ndim; i++) b->dims[i] = dims[i];
  b->numel = numel;
  b->nbytes = nbytes;
  mem_add(p, device, nbytes);
  *out = b;
  return NULL;
}

/* Ask PJRT for the dtype and dims of a buffer it created, then wrap it. */
static tp_status *buffer_wrap_queried(tp_plugin *p, PJRT_Buffer *pb, int device,
                                      tp_buffer **out) {
  tp_status *st = NULL;
  if (!HAS_SLOT(p->api, PJRT_Buffer_ElementType) ||
      !HAS_SLOT(p->api, PJRT_Buffer_Dimensions))
    st = missing_slot(p, "PJRT_Buffer_ElementType/PJRT_Buffer_Dimensions");
  PJRT_Buffer_ElementType_Args t;
  memset(&t, 0, sizeof t);
  t.struct_size = PJRT_Buffer_ElementType_Args_STRUCT_SIZE;
  t.buffer = pb;
  if (!st)
    st = from_pjrt(p->api, p->api->PJRT_Buffer_ElementType(&t),
                   "PJRT_Buffer_ElementType");
  PJRT_Buffer_Dimensions_Args d;
  memset(&d, 0, sizeof d);
  d.struct_size = PJRT_Buffer_Dimensions_Args_STRUCT_SIZE;
  d.buffer = pb;
  if (!st)
    st = from_pjrt(p->api, p->api->PJRT_Buffer_Dimensions(&d),
                   "PJRT_Buffer_Dimensions");
  tp_dtype dt = TP_DTYPE_INVALID;
  if (!st) {
    dt = tp_dtype_from_pjrt((int)t.type);
    if (dt == TP_DTYPE_INVALID)
      st = tp_error(TP_UNIMPLEMENTED,
                    "PJRT buffer has element type %d, which torch-pjrt does "
                    "not support",
                    (int)t.type);
    else if (d.num_dims > TP_MAX_RANK)
      st = tp_error(TP_UNIMPLEMENTED, "PJRT buffer has rank %zu > %d",
                    d.num_dims, TP_MAX_RANK);
  }
  if (st) {
    destroy_pjrt_buffer(p->api, pb);
    return st;
  }
  return buffer_wrap(p, pb, device, dt, d.dims, (int)d.num_dims, out);
}

tp_status *tp_buffer_from_host(tp_plugin *p, int device, tp_dtype dt,
                               const int64_t *dims, int ndim, const void *data,
                               tp_buffer **out) {
  if (!p || !out)
    return tp_error(TP_INVALID_ARGUMENT, "tp_buffer_from_host: NULL argument");
  *out = NULL;
  TP_RETURN_IF_ERROR(check_process(p));
  TP_RETURN_IF_ERROR(check_device(p, device, "tp_buffer_from_host"));
  int pjrt_type = tp_dtype_to_pjrt(dt);
  if (pjrt_type == PJRT_Buffer_Type_INVALID)
    return tp_error(TP_INVALID_ARGUMENT,
                    "tp_buffer_from_host: unsupported dtype %d", (int)dt);
  int64_t numel = 0;
  TP_RETURN_IF_ERROR(tp_error_wrap(shape_numel(dims, ndim, &numel),
                                   "tp_buffer_from_host"));
  static const uint64_t empty_data = 0; /* stands in for data of 0 bytes */
  if (!data) {
    if (numel != 0)
      return tp_error(TP_INVALID_ARGUMENT,
                      "tp_buffer_from_host: NULL data for %lld elements",
                      (long long)numel);
    data = &empty_data;
  }
  TP_RETURN_IF_ERROR(mem_check(p, device, numel * (int64_t)tp_dtype_size(dt)));

  PJRT_Client_BufferFromHostBuffer_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
  a.client = p->client;
  a.data = data;
  a.type = (PJRT_Buffer_Type)pjrt_type;
  a.dims = dims;
  a.num_dims = (size_t)ndim;
  a.byte_strides = NULL; /* dense row-major */
  a.num_byte_strides = 0;
  /* The plugin copies during the call; the event (if any) is ready at once
   * but must still be awaited and destroyed. */
  a.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
  a.device = p->devices[device];
  REQUIRE_SLOT(p, PJRT_Client_BufferFromHostBuffer);
  tp_trace_rec *rec = tp_trace_begin(TP_TRACE_H2D, device, "copy host to device",
                                     numel * (int64_t)tp_dtype_size(dt));
  tp_status *st = from_pjrt(p->api, p->api->PJRT_Client_BufferFromHostBuffer(&a),
                            "PJRT_Client_BufferFromHostBuffer");
  if (!st) st = await_event(p->api, a.done_with_host_buffer, "copying host data to the device");
  tp_trace_end(rec);
  if (st && !a.buffer) return st;
  if (st) {
    destroy_pjrt_buffer(p->api, a.buffer);
    return st;
  }
  return buffer_wrap(p, a.buffer, device, dt, dims, ndim, out);
}

tp_status *tp_buffer_to_host(tp_buffer *b, void *dst, size_t nbytes) {
  if (!b)
    return tp_error(TP_INVALID_ARGUMENT, "tp_buffer_to_host: NULL buffer");
  TP_RETURN_IF_ERROR(check_process(b->p));
  if (nbytes != b->nbytes)
    return tp_error(TP_INVALID_ARGUMENT,
                    "tp_buffer_to_host: destination has %zu bytes, buffer has "
                    "%zu",
                    nbytes, b->nbytes);
  if (!dst && nbytes != 0)
    return tp_error(TP_INVALID_ARGUMENT, "tp_buffer_to_host: NULL destination");
  tp_plugin *p = b->p;
  if (nbytes == 0) return tp_buffer_await(b);
  REQUIRE_SLOT(p, PJRT_Buffer_ToHostBuffer);

  /* First ask how many bytes the plugin will write: it must be exactly our
   * dense row-major size, or the data would be misread. */
  PJRT_Buffer_ToHostBuffer_Args q;
  memset(&q, 0, sizeof q);
  q.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
  q.src = b->buf;
  q.dst = NULL;
  TP_RETURN_IF_ERROR(from_pjrt(p->api, p->api->PJRT_Buffer_ToHostBuffer(&q),
                               "PJRT_Buffer_ToHostBuffer (size query)"));
  destroy_event(p->api, q.event);
  if (q.dst_size != nbytes)
    return tp_error(TP_INTERNAL,
                    "PJRT plugin wants %zu host bytes for a %s buffer of %lld "
                    "elements (expected %zu)",
                    q.dst_size, tp_dtype_name(b->dtype), (long long)b->numel,
                    nbytes);

  PJRT_Buffer_ToHostBuffer_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
  a.src = b->buf;
  a.dst = dst;
  a.dst_size = nbytes;
  tp_trace_rec *rec = tp_trace_begin(TP_TRACE_D2H, b->device, "copy device to host", (int64_t)nbytes);
  tp_status *st = from_pjrt(p->api, p->api->PJRT_Buffer_ToHostBuffer(&a), "PJRT_Buffer_ToHostBuffer");
  if (!st) st = await_event(p->api, a.event, "copying a buffer to the host");
  tp_trace_end(rec);
  return st;
}

tp_status *tp_buffer_copy_to_device(tp_buffer *b, int device,
                                    tp_buffer **out) {
  if (!b || !out)
    return tp_error(TP_INVALID_ARGUMENT,
                    "tp_buffer_copy_to_device: NULL argument");
  *out = NULL;
  tp_plugin *p = b->p;
  TP_RETURN_IF_ERROR(check_process(p));
  TP_RETURN_IF_ERROR(check_device(p, device, "tp_buffer_copy_to_device"));
  if (device == b->device)
    return tp_error(TP_INVALID_ARGUMENT,
                    "tp_buffer_copy_to_device: buffer is already on device %d",
                    device);
  TP_RETURN_IF_ERROR(mem_check(p, device, (int64_t)b->nbytes));
  REQUIRE_SLOT(p, PJRT_Buffer_CopyToDevice);
  PJRT_Buffer_CopyToDevice_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Buffer_CopyToDevice_Args_STRUCT_SIZE;
  a.buffer = b->buf;
  a.dst_device = p->devices[device];
  tp_trace_rec *rec = tp_trace_begin(TP_TRACE_D2D, device, "copy device to device", (int64_t)b->nbytes);
  tp_status *st = from_pjrt(p->api, p->api->PJRT_Buffer_CopyToDevice(&a), "PJRT_Buffer_CopyToDevice");
  tp_trace_end(rec);
  TP_RETURN_IF_ERROR(st);
  return buffer_wrap(p, a.dst_buffer, device, b->dtype, b->dims, b->ndim, out);
}

tp_status *tp_buffer_await(tp_buffer *b) {
  if (!b) return tp_error(TP_INVALID_ARGUMENT, "tp_buffer_await: NULL buffer");
  tp_plugin *p = b->p;
  TP_RETURN_IF_ERROR(check_process(p));
  REQUIRE_SLOT(p, PJRT_Buffer_ReadyEvent);
  PJRT_Buffer_ReadyEvent_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE;
  a.buffer = b->buf;
  TP_RETURN_IF_ERROR(from_pjrt(p->api, p->api->PJRT_Buffer_ReadyEvent(&a),
                               "PJRT_Buffer_ReadyEvent"));
  return await_event(p->api, a.event, "waiting for a buffer");
}

int tp_buffer_is_ready(tp_buffer *b) {
  if (!b) return 1;
  tp_status *st = check_process(b->p);
  if (st) {
    tp_status_free(st);
    return 1;
  }
  const PJRT_Api *api = b->p->api;
  if (!api->PJRT_Buffer_ReadyEvent || !api->PJRT_Event_IsReady) return 1;
  PJRT_Buffer_ReadyEvent_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE;
  a.buffer = b->buf;
  PJRT_Error *err = api->PJRT_Buffer_ReadyEvent(&a);
  if (err) {
    tp_status_free(from_pjrt(api, err, "PJRT_Buffer_ReadyEvent"));
    return 1;
  }
  PJRT_Event_IsReady_Args r;
  memset(&r, 0, sizeof r);
  r.struct_size = PJRT_Event_IsReady_Args_STRUCT_SIZE;
  r.event = a.event;
  err = api->PJRT_Event_IsReady(&r);
  int ready = err ? 1 : r.is_ready;
  if (err) tp_status_free(from_pjrt(api, err, "PJRT_Event_IsReady"));
  destroy_event(api, a.event);
  return ready;
}

/* ---- freeing buffers ------------------------------------------------------
 * PJRT_Buffer_Destroy blocks until every program that reads the buffer has
 * finished.  Dropping a tensor must not make the host wait for the device
 * (that would undo asynchronous execution), so freed buffers go to a queue
 * that one helper thread per plugin (started with the client) drains.  The
 * byte count drops at once.
 *
 * Waking the thread for every free would cost a futex wake and a context
 * switch per eager op, so it collects: woken by the first buffer queued, it
 * waits REAPER_BATCH_NS (or until REAPER_URGENT_BYTES are queued) before
 * destroying everything queued.  A full queue (the host far ahead of the
 * device) makes the caller destroy the buffer itself, and so wait: that
 * bounds the memory held by freed buffers.  In a forked child the plugin's
 * threads do not exist, and the buffer is left to the parent.
 *
 * A buffer is destroyed only once its value is computed: the program that
 * makes it may still run when its tensor is dropped (a result nobody keeps),
 * and synchronize must wait for that program as torch.cuda.synchronize waits
 * for all queued work, so tp_plugin_await_freed finishes the queue and the
 * batch the thread is working on. */

#define REAPER_MAX_PENDING 4096
#define REAPER_BATCH_NS 2000000L           /* 2 ms */
#define REAPER_URGENT_BYTES (64ull << 20)  /* 64 MiB */

struct reaper {
  pthread_mutex_t lock;
  pthread_cond_t wake;
  pthread_t thread;
  pthread_cond_t idle; /* signalled when a batch is finished */
  tp_buffer *head, *tail;
  int pending;
  size_t pending_bytes;
  bool busy; /* the thread is finishing a batch it took off the queue */
  bool stop;
};

static void destroy_buffer_now(tp_buffer *b) {
  /* An error here is the producing program's; whoever kept its other
   * results sees it, and this value is gone. */
  if (b->buf) tp_status_free(tp_buffer_await(b));
  destroy_pjrt_buffer(b->p->api, b->buf);
  free(b);
}

static void destroy_list(tp_buffer *list) {
  while (list) {
    tp_buffer *next = list->next;
    destroy_buffer_now(list);
    list = next;
  }
}

static void *reaper_main(void *arg) {
  struct reaper *r = arg;
  pthread_mutex_lock(&r->lock);
  for (;;) {
    while (!r->head && !r->stop) pthread_cond_wait(&r->wake, &r->lock);
    if (!r->head) break; /* stopping, and nothing left */
    if (!r->stop && r->pending_bytes < REAPER_URGENT_BYTES) {
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += REAPER_BATCH_NS;
      if (until.tv_nsec >= 1000000000L) {
        until.tv_sec += 1;
        until.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&r->wake, &r->lock, &until);
    }
    tp_buffer *list = r->head;
    r->head = r->tail = NULL;
    r->pending = 0;
    r->pending_bytes = 0;
    r->busy = true;
    pthread_mutex_unlock(&r->lock);
    destroy_list(list);
    pthread_mutex_lock(&r->lock);
    r->busy = false;
    pthread_cond_broadcast(&r->idle);
  }
  pthread_mutex_unlock(&r->lock);
  return NULL;
}

/* Start the plugin's reaper; without one (thread creation failed) frees
 * destroy buffers in the caller. */
static void reaper_start(tp_plugin *p) {
  struct reaper *r = calloc(1, sizeof *r);
  if (!r) return;
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->wake, NULL);
  pthread_cond_init(&r->idle, NULL);
  if (pthread_create(&r->thread, NULL, reaper_main, r) != 0) {
    pthread_cond_destroy(&r->idle);
    pthread_cond_destroy(&r->wake);
    pthread_mutex_destroy(&r->lock);
    free(r);
    return;
  }
  p->reaper = r;
}

/* Destroy every queued buffer and end the thread (before the client goes). */
static void reaper_stop(tp_plugin *p) {
  struct reaper *r = p->reaper;
  if (!r) return;
  pthread_mutex_lock(&r->lock);
  r->stop = true;
  pthread_cond_signal(&r->wake);
  pthread_mutex_unlock(&r->lock);
  pthread_join(r->thread, NULL);
  pthread_cond_destroy(&r->idle);
  pthread_cond_destroy(&r->wake);
  pthread_mutex_destroy(&r->lock);
  free(r);
  p->reaper = NULL;
}

void tp_plugin_await_freed(tp_plugin *p) {
  struct reaper *r = p ? p->reaper : NULL;
  if (!r || in_forked_child(p)) return;
  pthread_mutex_lock(&r->lock);
  tp_buffer *list = r->head;
  r->head = r->tail = NULL;
  r->pending = 0;
  r->pending_bytes = 0;
  while (r->busy) pthread_cond_wait(&r->idle, &r->lock);
  pthread_mutex_unlock(&r->lock);
  destroy_list(list);
}

void tp_buffer_free(tp_buffer *b) {
  if (!b) return;
  tp_plugin *p = b->p;
  mem_sub(p, b->device, b->nbytes);
  if (in_forked_child(p)) {
    free(b);
    return;
  }
  struct reaper *r = p->reaper;
  if (r) {
    pthread_mutex_lock(&r->lock);
    bool queued = r->pending < REAPER_MAX_PENDING;
    if (queued) {
      b->next = NULL;
      bool was_empty = !r->tail;
      if (r->tail)
        r->tail->next = b;
      else
        r->head = b;
      r->tail = b;
      r->pending++;
      bool urgent = r->pending_bytes < REAPER_URGENT_BYTES &&
                    r->pending_bytes + b->nbytes >= REAPER_URGENT_BYTES;
      r->pending_bytes += b->nbytes;
      if (was_empty || urgent) pthread_cond_signal(&r->wake);
    }
    pthread_mutex_unlock(&r->lock);
    if (queued) return;
  }
  destroy_buffer_now(b);
}

tp_dtype tp_buffer_dtype(const tp_buffer *b) { return b->dtype; }
int tp_buffer_rank(const tp_buffer *b) { return b->ndim; }
const int64_t *tp_buffer_dims(const tp_buffer *b) { return b->dims; }
int64_t tp_buffer_numel(const tp_buffer *b) { return b->numel; }
size_t tp_buffer_nbytes(const tp_buffer *b) { return b->nbytes; }
int tp_buffer_device(const tp_buffer *b) { return b->device; }

/* ---- programs ------------------------------------------------------------- */

/* Protocol-buffer wire format: a field key is (number << 3 | wire type);
 * wire type 0 is a varint, 2 is length-delimited.  All our values are
 * small, so each varint is one byte. */
#define PB_KEY(field, wire) ((uint8_t)(((field) << 3) | (wire)))

size_t tp_encode_compile_options(uint8_t *buf, size_t cap) {
  /* xla.ExecutableBuildOptionsProto: num_replicas = 1 (field 4),
   * num_partitions = 1 (field 5). */
  const uint8_t build[] = {PB_KEY(4, 0), 1, PB_KEY(5, 0), 1};
  /* xla.CompileOptionsProto: executable_build_options (field 3),
   * compile_portable_executable = true (field 4). */
  uint8_t msg[16];
  size_t n = 0;
  msg[n++] = PB_KEY(3, 2);
  msg[n++] = (uint8_t)sizeof build;
  memcpy(msg + n, build, sizeof build);
  n += sizeof build;
  msg[n++] = PB_KEY(4, 0);
  msg[n++] = 1;
  if (!buf || cap < n) return 0;
  memcpy(buf, msg, n);
  return n;
}

static void destroy_loaded(const PJRT_Api *api, PJRT_LoadedExecutable *exe) {
  if (!exe) return;
  PJRT_LoadedExecutable_Destroy_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE;
  a.executable = exe;
  destroy_error(api, api->PJRT_LoadedExecutable_Destroy(&a));
}

static void destroy_executable(const PJRT_Api *api, PJRT_Executable *exe) {
  if (!exe) return;
  PJRT_Executable_Destroy_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE;
  a.executable = exe;
  destroy_error(api, api->PJRT_Executable_Destroy(&a));
}

/* The PJRT_Executable behind a loaded one; destroy it with
 * destroy_executable. */
static tp_status *get_executable(const tp_plugin *p, PJRT_LoadedExecutable *le,
                                 PJRT_Executable **out) {
  REQUIRE_SLOT(p, PJRT_LoadedExecutable_GetExecutable);
  REQUIRE_SLOT(p, PJRT_Executable_Destroy);
  PJRT_LoadedExecutable_GetExecutable_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE;
  a.loaded_executable = le;
  TP_RETURN_IF_ERROR(
      from_pjrt(p->api, p->api->PJRT_LoadedExecutable_GetExecutable(&a),
                "PJRT_LoadedExecutable_GetExecutable"));
  *out = a.executable;
  return NULL;
}

/* The total size of an executable's outputs from their element types and
 * dims, or -1 where the plugin does not give them. */
static int64_t output_bytes(const tp_plugin *p, PJRT_Executable *exe, size_t n) {
  if (!HAS_SLOT(p->api, PJRT_Executable_OutputElementTypes) || !HAS_SLOT(p->api, PJRT_Executable_OutputDimensions))
    return -1;
  PJRT_Executable_OutputElementTypes_Args t;
  memset(&t, 0, sizeof t);
  t.struct_size = PJRT_Executable_OutputElementTypes_Args_STRUCT_SIZE;
  t.executable = exe;
  PJRT_Executable_OutputDimensions_Args d;
  memset(&d, 0, sizeof d);
  d.struct_size = PJRT_Executable_OutputDimensions_Args_STRUCT_SIZE;
  d.executable = exe;
  d.num_outputs = n;
  tp_status *st = from_pjrt(p->api, p->api->PJRT_Executable_OutputElementTypes(&t), "OutputElementTypes");
  if (!st) st = from_pjrt(p->api, p->api->PJRT_Executable_OutputDimensions(&d), "OutputDimensions");
  if (st || t.num_output_types != n) {
    tp_status_free(st);
    return -1;
  }
  int64_t total = 0;
  const int64_t *dims = d.dims;
  for (size_t i = 0; i < n; i++) {
    int64_t numel = 1;
    for (size_t j = 0; j < d.dim_sizes[i]; j++) numel *= dims[j];
    dims += d.dim_sizes[i];
    size_t esize = tp_dtype_size(tp_dtype_from_pjrt((int)t.output_types[i]));
    if (!esize) return -1;
    total += numel * (int64_t)esize;
  }
  return total;
}

static tp_status *count_outputs(const tp_plugin *p, PJRT_LoadedExecutable *le,
                                int *out, int64_t *out_bytes) {
  REQUIRE_SLOT(p, PJRT_Executable_NumOutputs);
  PJRT_Executable *exe = NULL;
  TP_RETURN_IF_ERROR(get_executable(p, le, &exe));
  PJRT_Executable_NumOutputs_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Executable_NumOutputs_Args_STRUCT_SIZE;
  a.executable = exe;
  tp_status *st = from_pjrt(p->api, p->api->PJRT_Executable_NumOutputs(&a),
                            "PJRT_Executable_NumOutputs");
  if (!st) {
    *out = (int)a.num_outputs;
    *out_bytes = output_bytes(p, exe, a.num_outputs);
  }
  destroy_executable(p->api, exe);
  return st;
}

/* Take ownership of `le` in a new tp_exec (destroying `le` on failure). */
static tp_status *exec_wrap(tp_plugin *p, PJRT_LoadedExecutable *le,
                            tp_exec **out) {
  int nout = 0;
  int64_t out_bytes = -1;
  tp_status *st = count_outputs(p, le, &nout, &out_bytes);
  tp_exec *e = st ? NULL : malloc(sizeof *e);
  if (!st && !e) st = out_of_memory("creating an executable");
  if (st) {
    destroy_loaded(p->api, le);
    return st;
  }
  e->p = p;
  e->exe = le;
  e->num_outputs = nout;
  e->out_bytes = out_bytes;
  snprintf(e->name, sizeof e->name, "program");
  *out = e;
  return NULL;
}

tp_status *tp_compile(tp_plugin *p, const char *mlir, size_t len,
                      tp_exec **out) {
  if (!p || !mlir || !out)
    return tp_error(TP_INVALID_ARGUMENT, "tp_compile: NULL argument");
  *out = NULL;
  TP_RETURN_IF_ERROR(check_process(p));
  REQUIRE_SLOT(p, PJRT_Client_Compile);
  uint8_t options[64];
  size_t options_len = tp_encode_compile_options(options, sizeof options);

  PJRT_Program prog;
  memset(&prog, 0, sizeof prog);
  prog.struct_size = PJRT_Program_STRUCT_SIZE;
  prog.code = (char *)mlir; /* PJRT does not write through it for Compile */
  prog.code_size = len;
  prog.format = "mlir";
  prog.format_size = strlen(prog.format);

  PJRT_Client_Compile_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE;
  a.client = p->client;
  a.program = &prog;
  a.compile_options = (const char *)options;
  a.compile_options_size = options_len;
  tp_status *st = from_pjrt(p->api, p->api->PJRT_Client_Compile(&a),
                            "compiling StableHLO");
  if (st) {
    /* A rejected program is the caller's input error; keep the codes that
     * mean something else (missing lowering, out of memory). */
    tp_code c = tp_status_code(st);
    if (c != TP_UNIMPLEMENTED && c != TP_RESOURCE_EXHAUSTED) {
      tp_status *st2 =
          tp_error(TP_INVALID_ARGUMENT, "%s", tp_status_message(st));
      tp_status_free(st);
      st = st2;
    }
    return st;
  }
  return exec_wrap(p, a.executable, out);
}

int tp_exec_num_outputs(const tp_exec *e) { return e ? e->num_outputs : 0; }

void tp_exec_set_name(tp_exec *e, const char *name) {
  if (e) snprintf(e->name, sizeof e->name, "%s", name ? name : "");
}

void tp_exec_free(tp_exec *e) {
  if (!e) return;
  destroy_loaded(e->p->api, e->exe);
  free(e);
}

static tp_status *check_execute_args(const tp_exec *e, int device,
                                     tp_buffer *const *args, int nargs,
                                     tp_buffer **outs, int nouts) {
  if (nargs < 0 || (nargs > 0 && !args))
    return tp_error(TP_INVALID_ARGUMENT, "tp_execute: bad argument list");
  if (nouts < e->num_outputs || (e->num_outputs > 0 && !outs))
    return tp_error(TP_INVALID_ARGUMENT,
                    "tp_execute: room for %d outputs, program has %d",
                    outs ? nouts : 0, e->num_outputs);
  TP_RETURN_IF_ERROR(check_device(e->p, device, "tp_execute"));
  for (int i = 0; i < nargs; i++) {
    if (!args[i])
      return tp_error(TP_INVALID_ARGUMENT, "tp_execute: argument %d is NULL",
                      i);
    if (args[i]->device != device)
      return tp_error(TP_INVALID_ARGUMENT,
                      "tp_execute: argument %d is on device %d, not %d", i,
                      args[i]->device, device);
  }
  return NULL;
}

/* A traced execution ends when its completion event fires; the event is
 * destroyed when the trace record is freed (never from its own callback). */
typedef struct {
  const PJRT_Api *api;
  PJRT_Event *event;
} traced_event;

static void traced_release(void *arg) {
  traced_event *t = arg;
  destroy_event(t->api, t->event);
  free(t);
}

typedef struct {
  const PJRT_Api *api;
  tp_trace_rec *rec;
} traced_done;

static void traced_on_ready(PJRT_Error *err, void *arg) {
  traced_done *d = arg;
  destroy_error(d->api, err);
  tp_trace_end(d->rec);
  free(d);
}

/* Stamp the end of `rec` when `ev` fires (at once if it cannot be watched). */
static void trace_when_ready(tp_plugin *p, tp_trace_rec *rec, PJRT_Event *ev) {
  traced_event *t = ev ? malloc(sizeof *t) : NULL;
  traced_done *d = t && HAS_SLOT(p->api, PJRT_Event_OnReady) ? malloc(sizeof *d) : NULL;
  if (!d) {
    free(t);
    if (ev) tp_status_free(await_event(p->api, ev, "a traced execution"));
    tp_trace_end(rec);
    return;
  }
  t->api = p->api;
  t->event = ev;
  tp_trace_attach(rec, traced_release, t);
  d->api = p->api;
  d->rec = rec;
  PJRT_Event_OnReady_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE;
  a.event = ev;
  a.callback = traced_on_ready;
  a.user_arg = d;
  PJRT_Error *err = p->api->PJRT_Event_OnReady(&a);
  if (err) {
    destroy_error(p->api, err);
    free(d);
    tp_trace_end(rec);
  }
}

/* Launch `e` on one device with PJRT buffers `argv`; fill `outv`.
 * `keep` lists the argument indices that must not be donated. */
static tp_status *launch(tp_exec *e, int device, PJRT_Buffer *const *argv,
                         int nargs, const int64_t *keep, size_t nkeep,
                         PJRT_Buffer **outv) {
  tp_plugin *p = e->p;
  PJRT_ExecuteOptions opts;
  memset(&opts, 0, sizeof opts);
  opts.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  opts.non_donatable_input_indices = keep;
  opts.num_non_donatable_input_indices = nkeep;

  PJRT_Buffer *const *arg_lists[1] = {argv};
  PJRT_Buffer **out_lists[1] = {outv};
  PJRT_LoadedExecutable_Execute_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
  a.executable = e->exe;
  a.options = &opts;
  a.argument_lists = arg_lists;
  a.num_devices = 1;
  a.num_args = (size_t)nargs;
  a.output_lists = out_lists;
  /* Execution stays asynchronous, and an error in it surfaces when an
   * output is awaited or read.  Only a profiler's trace asks for the
   * completion event, to time it. */
  tp_trace_rec *rec = tp_trace_begin(TP_TRACE_EXECUTE, device, e->name, e->out_bytes > 0 ? e->out_bytes : 0);
  PJRT_Event *done[1] = {NULL};
  a.device_complete_events = rec ? done : NULL;
  /* The executable is portable, so it runs on whichever device we name. */
  a.execute_device = p->devices[device];
  tp_status *st = from_pjrt(p->api, p->api->PJRT_LoadedExecutable_Execute(&a),
                            "PJRT_LoadedExecutable_Execute");
  if (rec) {
    tp_trace_launched(rec);
    if (st) tp_trace_end(rec);
    else trace_when_ready(p, rec, done[0]);
  }
  return st;
}

/* Wrap every output; on failure release all of them (wrapped or not). */
static tp_status *wrap_outputs(tp_exec *e, int device, PJRT_Buffer **outv,
                               tp_buffer **outs) {
  for (int i = 0; i < e->num_outputs; i++) {
    tp_status *st = buffer_wrap_queried(e->p, outv[i], device, &outs[i]);
    if (st) { /* outv[i] was destroyed by buffer_wrap_queried */
      for (int j = 0; j < i; j++) {
        tp_buffer_free(outs[j]);
        outs[j] = NULL;
      }
      for (int j = i + 1; j < e->num_outputs; j++)
        destroy_pjrt_buffer(e->p->api, outv[j]);
      return st;
    }
  }
  return NULL;
}

/* Arrays up to this many entries live on the stack; larger ones are
 * malloc'd. */
#define SMALL_ARGS 32

tp_status *tp_execute(tp_exec *e, int device, tp_buffer *const *args,
                      int nargs, const unsigned char *donate, tp_buffer **outs, int nouts) {
  if (!e) return tp_error(TP_INVALID_ARGUMENT, "tp_execute: NULL executable");
  TP_RETURN_IF_ERROR(check_process(e->p));
  TP_RETURN_IF_ERROR(check_execute_args(e, device, args, nargs, outs, nouts));
  REQUIRE_SLOT(e->p, PJRT_LoadedExecutable_Execute);

  PJRT_Buffer *argv_small[SMALL_ARGS], *outv_small[SMALL_ARGS];
  int64_t keep_small[SMALL_ARGS];
  int nout = e->num_outputs;
  PJRT_Buffer **argv = nargs > SMALL_ARGS
                           ? malloc(sizeof(PJRT_Buffer *) * (size_t)nargs)
                           : argv_small;
  int64_t *keep = nargs > SMALL_ARGS ? malloc(sizeof(int64_t) * (size_t)nargs)
                                     : keep_small;
  PJRT_Buffer **outv = nout > SMALL_ARGS
                           ? malloc(sizeof(PJRT_Buffer *) * (size_t)nout)
                           : outv_small;
  tp_status *st = NULL;
  if (!argv || !keep || !outv) st = out_of_memory("preparing an execution");

  if (!st && e->out_bytes > 0) { /* what the outputs add, less what donation frees */
    int64_t need = e->out_bytes;
    for (int i = 0; donate && i < nargs; i++)
      if (donate[i]) need -= (int64_t)args[i]->nbytes;
    st = mem_check(e->p, device, need);
  }
  if (!st) {
    /* Every argument not named in `donate` is listed as non-donatable, so
     * PJRT never reuses a buffer the caller still needs. */
    size_t nkeep = 0;
    for (int i = 0; i < nargs; i++) {
      argv[i] = args[i]->buf;
      if (!donate || !donate[i]) keep[nkeep++] = i;
    }
    for (int i = 0; i < nout; i++) outv[i] = NULL;
    st = launch(e, device, argv, nargs, keep, nkeep, outv);
    if (!st) st = wrap_outputs(e, device, outv, outs);
  }

  if (argv != argv_small) free(argv);
  if (keep != keep_small) free(keep);
  if (outv != outv_small) free(outv);
  return st;
}

/* ---- serialization -------------------------------------------------------- */

tp_status *tp_exec_serialize(tp_exec *e, void **data, size_t *len) {
  if (!e || !data || !len)
    return tp_error(TP_INVALID_ARGUMENT, "tp_exec_serialize: NULL argument");
  *data = NULL;
  *len = 0;
  tp_plugin *p = e->p;
  REQUIRE_SLOT(p, PJRT_Executable_Serialize);
  PJRT_Executable *exe = NULL;
  TP_RETURN_IF_ERROR(get_executable(p, e->exe, &exe));

  PJRT_Executable_Serialize_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Executable_Serialize_Args_STRUCT_SIZE;
  a.executable = exe;
  tp_status *st = from_pjrt(p->api, p->api->PJRT_Executable_Serialize(&a),
                            "PJRT_Executable_Serialize");
  if (!st) {
    void *copy = malloc(a.serialized_bytes_size ? a.serialized_bytes_size : 1);
    if (!copy) {
      st = out_of_memory("serializing an executable");
    } else {
      if (a.serialized_bytes_size)
        memcpy(copy, a.serialized_bytes, a.serialized_bytes_size);
      *data = copy;
      *len = a.serialized_bytes_size;
    }
    if (a.serialized_executable_deleter)
      a.serialized_executable_deleter(a.serialized_executable);
  }
  destroy_executable(p->api, exe);
  return st;
}

tp_status *tp_exec_deserialize(tp_plugin *p, const void *data, size_t len,
                               tp_exec **out) {
  if (!p || !data || !out)
    return tp_error(TP_INVALID_ARGUMENT, "tp_exec_deserialize: NULL argument");
  *out = NULL;
  TP_RETURN_IF_ERROR(check_process(p));
  REQUIRE_SLOT(p, PJRT_Executable_DeserializeAndLoad);
  PJRT_Executable_DeserializeAndLoad_Args a;
  memset(&a, 0, sizeof a);
  a.struct_size = PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE;
  a.client = p->client;
  a.serialized_executable = data;
  a.serialized_executable_size = len;
  TP_RETURN_IF_ERROR(
      from_pjrt(p->api, p->api->PJRT_Executable_DeserializeAndLoad(&a),
                "PJRT_Executable_DeserializeAndLoad"));
  return exec_wrap(p, a.loaded_executable, out);
}

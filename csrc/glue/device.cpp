// device.cpp - the PrivateUse1 device guard and allocator.
//
// Both are registered from static initialisers when _glue.so is loaded.
// Neither needs the runtime to be open at load time: they ask it for the
// device count on each use, and report "no devices" as a clear error.

#include "eager.h"
#include "glue.h"

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <string>

namespace torch_pjrt {

// One current device per thread, like CUDA's.  PJRT has no notion of a
// current device, so this is purely PyTorch-side state.
static thread_local c10::DeviceIndex tls_device = 0;

c10::DeviceIndex device_count() noexcept {
  int n = tp_runtime_device_count();
  if (n < 0) return 0;
  constexpr int kMax = std::numeric_limits<c10::DeviceIndex>::max();
  return static_cast<c10::DeviceIndex>(n > kMax ? kMax : n);
}

void check_device(c10::DeviceIndex index) {
  const c10::DeviceIndex n = device_count();
  const std::string name = c10::get_privateuse1_backend();
  // Worded like CUDA's "invalid device ordinal", plus what would help.
  TORCH_CHECK(index >= 0 && index < n, name, " error: invalid device ordinal ",
              static_cast<int>(index), ": ", static_cast<int>(n), " ", name,
              " device(s) available",
              n == 0 ? " (is the runtime initialised? import torch_pjrt)" : "");
}

c10::DeviceIndex current_device() { return tls_device; }

void set_device(c10::DeviceIndex index) {
  if (index == -1) return; // an unindexed "tpu" means the current device
  check_device(index);
  tls_device = index;
}

[[noreturn]] void throw_status(tp_status* st, const char* what) {
  std::string msg = st ? tp_status_message(st) : "unknown error";
  bool index = st && tp_status_code(st) == TP_OUT_OF_RANGE;
  bool oom = st && tp_status_code(st) == TP_RESOURCE_EXHAUSTED;
  tp_status_free(st);
  TORCH_CHECK_INDEX(!index, c10::get_privateuse1_backend(), ": ", what, ": ", msg);
  TORCH_CHECK_WITH(OutOfMemoryError, !oom, c10::get_privateuse1_backend(), ": ", what, ": ", msg);
  TORCH_CHECK(false, c10::get_privateuse1_backend(), ": ", what, ": ", msg);
}

namespace {

// ---------------------------------------------------------------- allocator

void delete_storage(void* p) { tp_storage_free(static_cast<tp_storage*>(p)); }

// A DeviceAllocator (not just an Allocator) so that torch.accelerator's
// memory functions reach the core's accounting, as they reach CUDA's.
struct TpAllocator final : c10::DeviceAllocator {
  // A handle even for 0 bytes: resize_ and set_ later grow it in place, and
  // PyTorch treats a null DataPtr as "no storage".  The device buffer itself
  // is created lazily by the core on first write.
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex dev = current_device();
    check_device(dev);
    // The buffer comes later, but a size that can never fit fails here, as
    // CUDA's allocator would, not at some later op.  (Every device holds a
    // GiB: smaller sizes, nearly every allocation, skip the runtime's lock.)
    const int64_t cap = nbytes > (size_t{1} << 30) ? tp_runtime_device_capacity(dev) : 0;
    if (cap > 0 && nbytes > static_cast<uint64_t>(cap)) {
      constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
      char msg[256];
      std::snprintf(msg, sizeof msg,
                    "%s out of memory. Tried to allocate %.2f GiB. %s has a "
                    "total capacity of %.2f GiB.",
                    c10::get_privateuse1_backend().c_str(), nbytes / kGiB,
                    c10::Device(kTpu, dev).str().c_str(), cap / kGiB);
      TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
    }
    tp_storage* s = tp_storage_new(dev, nbytes);
    TORCH_CHECK_WITH(OutOfMemoryError, s != nullptr,
                     "out of host memory creating a storage handle for ",
                     nbytes, " bytes on ", c10::Device(kTpu, dev));
    // data == context, so raw_allocate/raw_deallocate also work.
    return {s, s, &delete_storage, c10::Device(kTpu, dev)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_storage; }

  bool initialized() override { return device_count() > 0; }
  // Freed buffers go back to the plugin at once: nothing is cached.
  void emptyCache(c10::MempoolId_t) override {}
  // One in-order stream per device: a buffer is never reused under a
  // pending use by another stream.
  void recordStream(const c10::DataPtr&, c10::Stream) override {}

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex dev) override {
    check_device(dev);
    tp_mem_stats ms{};
    if (tp_status* st = tp_plugin_mem_stats(tp_runtime_plugin(), dev, &ms)) throw_status(st, "memory statistics");
    c10::CachingDeviceAllocator::DeviceStats stats;
    // No caching: bytes allocated, reserved and active are the same.
    for (c10::CachingDeviceAllocator::StatArray* a : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
                                                     &stats.requested_bytes}) {
      (*a)[0].current = ms.bytes_in_use;
      (*a)[0].peak = ms.peak_bytes;
    }
    for (c10::CachingDeviceAllocator::StatArray* a : {&stats.allocation, &stats.active, &stats.segment})
      (*a)[0].current = ms.live_buffers;
    return stats;
  }

  void resetAccumulatedStats(c10::DeviceIndex) override {}

  void resetPeakStats(c10::DeviceIndex dev) override {
    check_device(dev);
    if (tp_status* st = tp_plugin_reset_peak(tp_runtime_plugin(), dev)) throw_status(st, "resetting peak statistics");
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex dev) override {
    check_device(dev);
    int64_t total = 0, free_bytes = 0;
    if (tp_status* st = tp_plugin_device_memory(tp_runtime_plugin(), dev, &total, &free_bytes)) {
      tp_status_free(st);  // host memory backs the device (the XLA CPU plugin)
      tp_mem_stats ms{};
      if (tp_status* s2 = tp_plugin_mem_stats(tp_runtime_plugin(), dev, &ms)) throw_status(s2, "memory statistics");
      total = tp_runtime_device_capacity(dev);
      free_bytes = total > ms.bytes_in_use ? total - ms.bytes_in_use : 0;
    }
    return {static_cast<size_t>(free_bytes), static_cast<size_t>(total)};
  }

  // Allocator::clone() would copy bytes between two handles; device data
  // only moves through the op path (copy_ -> _copy_from -> C core).
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, c10::get_privateuse1_backend(),
                ": the allocator cannot copy device memory; copy tensors "
                "with Tensor.copy_ or .clone() instead");
  }
};

TpAllocator g_allocator;

} // namespace

c10::Allocator* allocator() { return &g_allocator; }

bool is_tp_data_ptr(const c10::DataPtr& p) {
  return p.get_deleter() == &delete_storage;
}

namespace {

// ------------------------------------------------------------- device guard

// Streams and events are placeholders: each device has one in-order default
// stream (the order the eager engine issues PJRT work), so "wait for event /
// stream" is trivially satisfied.  Waiting for outstanding device work is
// torch.tpu.synchronize, implemented by the Python layer.
struct TpGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTpu; }

  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kTpu, current_device()}; }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kTpu, "expected a ", kTpu, " device, got ", d);
    set_device(d.index());
  }
  // Used by guard destructors to restore a device that was valid before.
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0) tls_device = d.index();
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }

  static c10::Stream default_stream(c10::Device d) {
    if (d.index() == -1) d = c10::Device(kTpu, current_device());
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getStream(c10::Device d) const override {
    return default_stream(d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return default_stream(d);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return default_stream(d);
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    return default_stream(d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return default_stream(s.device());
  }
  bool queryStream(const c10::Stream&) const override { return true; }
  // One stream per device: waiting for it is waiting for every pending
  // computation whose result lives on that device.
  void synchronizeStream(const c10::Stream& s) const override {
    synchronizeDevice(s.device_index());
  }
  void synchronizeDevice(c10::DeviceIndex d) const override {
    tp_status* st = tp_eager_synchronize(d);
    if (st) throw_status(st, "synchronize");
  }

  // Events.  With a single in-order stream, blocking on or querying one has
  // nothing to wait for, so an event without timing is nothing (*event stays
  // null).  The plugin's stream carries no timestamps, so a timing event
  // (enable_timing=True, BACKEND_DEFAULT) waits for the device when recorded
  // and keeps the host's clock: elapsed_time between two of them is the time
  // the work queued between the records took, as CUDA's measures.
  void record(void** event, const c10::Stream& s, c10::DeviceIndex,
              c10::EventFlag flag) const override {
    if (flag != c10::EventFlag::BACKEND_DEFAULT) return;
    synchronizeDevice(s.device_index());
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
    if (*event == nullptr) *event = new double(ms);
    else *static_cast<double*>(*event) = ms;
  }
  void destroyEvent(void* event, c10::DeviceIndex) const noexcept override {
    delete static_cast<double*>(event);
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void synchronizeEvent(void*) const override {}
  double elapsedTime(void* a, void* b, c10::DeviceIndex) const override {
    TORCH_CHECK(a != nullptr && b != nullptr,
                "Both events must be recorded with enable_timing=True before "
                "calculating elapsed time.");
    return *static_cast<double*>(b) - *static_cast<double*>(a);
  }
};

} // namespace
} // namespace torch_pjrt

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &torch_pjrt::g_allocator)
C10_REGISTER_GUARD_IMPL(PrivateUse1, torch_pjrt::TpGuardImpl);

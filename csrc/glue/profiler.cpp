// profiler.cpp - device events in torch.profiler.
//
// PyTorch's profiler (Kineto) takes device events from "child" activity
// profilers that a backend registers.  Ours turns the C core's trace
// (csrc/core/trace.h) into Kineto activities: program executions become
// kernels, copies memcpys, compiles and disk-cache loads runtime events,
// each linked to the CPU op that launched it through the correlation id
// Kineto pushes on the launching thread.  PyTorch then shows device time in
// key_averages() and a device track in export_chrome_trace().

#include "glue.h"

#include <c10/util/ApproximateClock.h>

// kineto's headers format metadata with fmt, which libtorch does not
// export: compile fmt into this file.
#define FMT_HEADER_ONLY 1
#include <kineto/libkineto.h>
#include <kineto/output_base.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdlib>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

extern "C" {
#include "eager.h"
#include "trace.h"
}

namespace torch_pjrt {
namespace {

// How long processTrace waits for programs still running (they finish by
// themselves; this only bounds a wedged device).
constexpr int kWaitMs = 60000;
// Ids of launch/device event pairs, above the CPU ops' correlation ids.
constexpr int32_t kPairIds = 1 << 30;

libkineto::ActivityType activity_type(tp_trace_kind k) {
  switch (k) {
    case TP_TRACE_EXECUTE:
      return libkineto::ActivityType::CONCURRENT_KERNEL;
    case TP_TRACE_H2D:
    case TP_TRACE_D2H:
    case TP_TRACE_D2D:
      return libkineto::ActivityType::GPU_MEMCPY;
    case TP_TRACE_COMPILE:
    case TP_TRACE_CACHE_LOAD:
      return libkineto::ActivityType::PRIVATEUSE1_RUNTIME;
  }
  return libkineto::ActivityType::PRIVATEUSE1_RUNTIME;
}

std::string event_name(const tp_trace_event& e) {
  switch (e.kind) {
    case TP_TRACE_COMPILE:
      return std::string("tpu compile ") + e.name;
    case TP_TRACE_CACHE_LOAD:
      return std::string("tpu cache load ") + e.name;
    case TP_TRACE_H2D:
      return "Memcpy HtoD (host -> tpu)";
    case TP_TRACE_D2H:
      return "Memcpy DtoH (tpu -> host)";
    case TP_TRACE_D2D:
      return "Memcpy DtoD (tpu -> tpu)";
    default:
      return std::string("tpu program ") + e.name;
  }
}

// The PJRT call that launched a device event, as CUDA traces show
// cudaLaunchKernel: a host-side runtime event on the launching thread.
const char* launch_name(tp_trace_kind k) {
  switch (k) {
    case TP_TRACE_EXECUTE:
      return "PJRT_LoadedExecutable_Execute";
    case TP_TRACE_H2D:
      return "PJRT_Client_BufferFromHostBuffer";
    case TP_TRACE_D2H:
      return "PJRT_Buffer_ToHostBuffer";
    case TP_TRACE_D2D:
      return "PJRT_Buffer_CopyToDevice";
    default:
      return "";
  }
}

class Session final : public libkineto::IActivityProfilerSession {
 public:
  ~Session() override {
    if (recording_) tp_trace_stop(); // dropped without a stop
  }

  void start() override {
    tp_status* st = tp_trace_start();
    if (st) {
      errors_.emplace_back(tp_status_message(st));
      tp_status_free(st);
      status_ = libkineto::TraceStatus::ERROR;
      return;
    }
    started_ = recording_ = true;
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    if (recording_) tp_trace_stop();
    recording_ = false;
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return errors_; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback linked, int64_t,
                    int64_t) override {
    if (!started_) return;
    started_ = false;
    tp_trace_event* ev = nullptr;
    size_t n = 0, dropped = 0;
    tp_status* st = tp_trace_take(kWaitMs, &ev, &n, &dropped);
    if (st) {
      errors_.emplace_back(tp_status_message(st));
      tp_status_free(st);
      return;
    }
    if (dropped)
      errors_.push_back(std::to_string(dropped) +
                        " tpu events were not recorded (the trace keeps at most " +
                        std::to_string(TP_TRACE_MAX_EVENTS) + ")");
    int64_t lo = n ? ev[0].start_ns : 0, hi = lo;
    for (size_t i = 0; i < n; i++) {
      lo = std::min(lo, ev[i].start_ns);
      hi = std::max(hi, ev[i].end_ns);
    }
    buffer_.span = libkineto::TraceSpan(lo, hi, "tpu");
    for (size_t i = 0; i < n; i++) {
      const tp_trace_event& e = ev[i];
      if (!tp_trace_kind_on_device(e.kind)) {
        add(logger, linked, e, static_cast<int32_t>(e.correlation), activity_type(e.kind), event_name(e),
            e.start_ns, e.end_ns, false, false);
        continue;
      }
      // The launch on the host thread, then the device event; a flow
      // arrow joins them when the launching op is known.
      // The pair shares an id of its own, as CUDA's launch and kernel share
      // CUPTI's: one op may launch several programs, and each arrow needs
      // its own id.
      const int32_t pair = kPairIds + static_cast<int32_t>(i);
      add(logger, linked, e, pair, libkineto::ActivityType::PRIVATEUSE1_RUNTIME, launch_name(e.kind),
          e.launch_start_ns, e.launch_end_ns, false, true);
      add(logger, linked, e, pair, activity_type(e.kind), event_name(e), e.start_ns, e.end_ns, true, false);
      if (std::find(devices_.begin(), devices_.end(), e.device) == devices_.end())
        devices_.push_back(e.device);
    }
    free(ev);
  }

  // One activity of `e`: on the device's row (the device index as the
  // process, stream 0) or on the launching thread's.
  void add(libkineto::ActivityLogger& logger, const libkineto::getLinkedActivityCallback& linked,
           const tp_trace_event& e, int32_t id, libkineto::ActivityType type, const std::string& name,
           int64_t start, int64_t end, bool on_device, bool flow_start) {
    buffer_.emplace_activity(buffer_.span, type, name);
    auto& a = libkineto::CpuTraceBuffer::toRef(buffer_.activities.back());
    a.startTime = start;
    a.endTime = end;
    a.id = id;
    a.threadId = static_cast<int32_t>(e.thread);
    if (on_device) {
      a.device = e.device;
      a.resource = 0;
      a.addMetadata("device", e.device);
      a.addMetadata("stream", 0);
    } else {
      a.device = static_cast<int32_t>(getpid());
      a.resource = static_cast<int32_t>(e.thread);
    }
    a.addMetadata("correlation", e.correlation);
    if (e.bytes > 0) a.addMetadata("bytes", e.bytes);
    if (e.correlation) {
      if (on_device || flow_start) {
        a.flow.id = static_cast<uint32_t>(id);
        a.flow.type = libkineto::kLinkAsyncCpuGpu;
        a.flow.start = flow_start;
      }
      if (linked) a.linked = linked(static_cast<int32_t>(e.correlation));
    }
    logger.handleActivity(a);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    tp_plugin* p = tp_runtime_plugin();
    const char* platform = p ? tp_plugin_platform(p) : nullptr;
    return std::make_unique<libkineto::DeviceInfo>(
        0, 0, c10::get_privateuse1_backend(),
        std::string("tpu 0 (PJRT ") + (platform ? platform : "?") + ")");
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> r;
    for (int d : devices_) r.emplace_back(d, 0, d, "stream 0");
    return r;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::make_unique<libkineto::CpuTraceBuffer>(std::move(buffer_));
  }

  void pushCorrelationId(uint64_t id) override { tp_trace_push_correlation(id); }
  void popCorrelationId() override { tp_trace_pop_correlation(); }

 private:
  bool started_ = false;   // this session started the trace; its events are not taken yet
  bool recording_ = false; // ... and it still records
  std::vector<std::string> errors_;
  std::vector<int> devices_;
  libkineto::CpuTraceBuffer buffer_;
};

class Profiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override {
    static const std::string n = "torch_pjrt";
    return n;
  }
  const std::set<libkineto::ActivityType>& availableActivities() const override {
    static const std::set<libkineto::ActivityType> a = {
        libkineto::ActivityType::CONCURRENT_KERNEL, libkineto::ActivityType::GPU_MEMCPY,
        libkineto::ActivityType::PRIVATEUSE1_RUNTIME};
    return a;
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& types, const libkineto::Config&) override {
    // Kineto asks for PRIVATEUSE1_RUNTIME even for a CPU-only profile; the
    // device's activities (kernels, memcpys) are what ProfilerActivity.
    // PrivateUse1 adds.
    if (types.count(libkineto::ActivityType::CONCURRENT_KERNEL) ||
        types.count(libkineto::ActivityType::GPU_MEMCPY))
      return std::make_unique<Session>();
    return nullptr;
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t, int64_t, const std::set<libkineto::ActivityType>& types,
      const libkineto::Config& config) override {
    return configure(types, config);
  }
};

// The legacy profiler (torch.autograd.profiler.profile(use_device="tpu")
// without Kineto) times each op with a pair of device events.  The plugin's
// stream has no timestamps, so an event waits for the device and keeps the
// host clock, as the c10 timing events in device.cpp do: an op's device
// time is its launch plus the work it queued.
struct LegacyStubs final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    c10::DeviceIndex d = current_device();
    if (device) *device = d;
    sync(d);
    auto t = std::make_shared<int64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::steady_clock::now().time_since_epoch())
            .count());
    if (cpu_ns) *cpu_ns = c10::getTime();
    *event = std::static_pointer_cast<void>(t);
  }
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* a,
                const torch::profiler::impl::ProfilerVoidEventStub* b) const override {
    if (!a || !b || !*a || !*b) return 0.f;
    const int64_t ns = *static_cast<int64_t*>(b->get()) - *static_cast<int64_t*>(a->get());
    return static_cast<float>(ns) / 1000.f; // microseconds, as CUDA's stubs return
  }
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    for (int d = 0; d < device_count(); d++) op(d);
  }
  void synchronize() const override {
    for (int d = 0; d < device_count(); d++) sync(static_cast<c10::DeviceIndex>(d));
  }

 private:
  static void sync(c10::DeviceIndex d) {
    if (d < 0 || d >= device_count()) return;
    tp_status* st = tp_eager_synchronize(d);
    if (st) throw_status(st, "synchronize");
  }
};

LegacyStubs g_legacy_stubs;

// Registered when the glue loads; a session records nothing until the
// runtime runs programs.
const bool registered = [] {
  libkineto::api().registerProfilerFactory([] { return std::make_unique<Profiler>(); });
  torch::profiler::impl::registerPrivateUse1Methods(&g_legacy_stubs);
  return true;
}();

} // namespace
} // namespace torch_pjrt

// hooks.cpp - PrivateUse1HooksInterface and the "tpu" generator.
//
// The hooks are how device-generic PyTorch code (torch.Generator, pinned
// memory checks, UntypedStorage.resize_, torch.accelerator) reaches the
// backend.  Only the virtuals torch 2.13 declares are overridden.

#include "glue.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
// The header names std::hardware_destructive_interference_size, which GCC
// warns is ABI-fragile; PyTorch built with the same value.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winterference-size"
#include <ATen/core/CachingHostAllocator.h>
#pragma GCC diagnostic pop
#include <ATen/core/Generator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

namespace torch_pjrt {

void resize_storage_bytes(const c10::Storage& storage, size_t nbytes) {
  TORCH_CHECK(storage.resizable(),
              "Trying to resize storage that is not resizable");
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  const c10::DataPtr& dp = impl->data_ptr();
  if (dp.get() == nullptr) {
    // Defensive: our allocator never returns null, but a storage built
    // elsewhere might carry none.  Give it a handle on its own device.
    c10::OptionalDeviceGuard guard;
    if (dp.device().type() == kTpu) guard.reset_device(dp.device());
    impl->set_data_ptr_noswap(allocator()->allocate(nbytes));
  } else {
    TORCH_CHECK(is_tp_data_ptr(dp), "cannot resize a ",
                c10::get_privateuse1_backend(),
                " storage that was not made by its allocator");
    // Same handle, new size: the core keeps the first min(old, new) bytes.
    tp_status* st = tp_storage_resize(static_cast<tp_storage*>(dp.get()),
                                      nbytes);
    if (st) throw_status(st, "resizing a storage failed");
  }
  impl->set_nbytes(nbytes);
}

namespace {

// ---------------------------------------------------------------- generator

// The random state is a (seed, counter) pair; the C core turns it into the
// random numbers.  A device's default generator is a view of that device's
// state in the C runtime (tp_runtime_rng_advance), which ops without a
// generator argument use.  A generator the user creates
// (torch.Generator("tpu")) keeps its own pair here; an op given it reserves
// its counter values from it (the Python kernel passes the pair to
// _C.run).  It subclasses CPUGeneratorImpl (as OpenReg does) only for the
// boilerplate; the inherited mt19937 engine is never used.
struct TpGenerator final : at::CPUGeneratorImpl {
  TpGenerator(c10::DeviceIndex index, bool is_default) : default_(is_default) {
    device_ = c10::Device(kTpu, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
    seed_ = c10::default_rng_seed_val;
  }
  int dev() const { return device_.index(); }

  void set_current_seed(uint64_t seed) override {
    if (default_) {
      tp_runtime_manual_seed(dev(), seed); // also resets the counter
    } else {
      seed_ = seed;
      offset_ = 0;
    }
  }
  uint64_t current_seed() const override {
    return default_ ? tp_runtime_initial_seed(dev()) : seed_;
  }
  uint64_t seed() override {
    const uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  uint64_t get_offset() const override {
    if (!default_) return offset_;
    uint64_t seed = 0, offset = 0;
    tp_runtime_rng_advance(dev(), 0, &seed, &offset); // reserves nothing
    return offset;
  }
  // The runtime has no "set counter"; reseeding resets it to 0 and then
  // reserving `offset` values moves it exactly there.
  void set_offset(uint64_t offset) override {
    if (!default_) {
      offset_ = offset;
      return;
    }
    uint64_t seed = 0, first = 0;
    tp_runtime_manual_seed(dev(), current_seed());
    tp_runtime_rng_advance(dev(), offset, &seed, &first);
  }

  // State tensor: 16 bytes, uint64 seed then uint64 counter (host order).
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    const uint64_t words[2] = {current_seed(), get_offset()};
    auto t = at::detail::empty_cpu({16}, at::kByte);
    std::memcpy(t.mutable_data_ptr(), words, sizeof words);
    return t.getIntrusivePtr();
  }
  void set_state(const c10::TensorImpl& state) override {
    at::detail::check_rng_state(state);
    TORCH_CHECK(state.numel() == 16, "RNG state of a ",
                c10::get_privateuse1_backend(),
                " generator must be 16 bytes, got ", state.numel());
    uint64_t words[2];
    std::memcpy(words, state.data(), sizeof words);
    set_current_seed(words[0]);
    set_offset(words[1]);
  }

 private:
  // A clone of the default generator shares the device's runtime state; a
  // clone of a user generator copies its pair (graphsafe_get_state, fork_rng).
  TpGenerator* clone_impl() const override {
    auto* g = new TpGenerator(dev(), default_);
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }
  bool default_;
  uint64_t seed_ = 0, offset_ = 0;
};

c10::DeviceIndex resolve(c10::DeviceIndex index) {
  if (index == -1) index = current_device();
  check_device(index);
  return index;
}

const at::Generator& default_generator(c10::DeviceIndex index) {
  index = resolve(index);
  // Created on demand: the runtime (and so the device count) may be opened
  // after this library is loaded.  A deque keeps references stable.
  static std::mutex mu;
  static std::deque<at::Generator> gens;
  std::lock_guard<std::mutex> lock(mu);
  while (gens.size() <= static_cast<size_t>(index))
    gens.push_back(at::make_generator<TpGenerator>(
        static_cast<c10::DeviceIndex>(gens.size()), true));
  return gens[index];
}

// -------------------------------------------------------------------- hooks

// Pinned host memory: ordinary host memory, remembered so that is_pinned()
// answers as for CUDA.  PJRT copies any host memory itself, so nothing is
// locked, but PyTorch code asks: DataLoader(pin_memory=True), and DDP's
// reducer with find_unused_parameters or static_graph, which asserts that
// its staging tensor is pinned.  g_pinned maps each block's start to its size.
std::mutex g_pinned_mu;
std::map<const char*, size_t> g_pinned;

void free_pinned(void* p) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mu);
    g_pinned.erase(static_cast<const char*>(p));
  }
  c10::free_cpu(p);
}

bool in_pinned_block(const void* ptr) {
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(g_pinned_mu);
  auto it = g_pinned.upper_bound(p);
  if (it == g_pinned.begin()) return false;
  --it;
  return p < it->first + std::max<size_t>(it->second, 1);
}

// PyTorch's host allocator for the device too (torch.accelerator's
// empty_host_cache() and host memory stats ask for it; without one they
// dereference null).  Nothing is cached, so there is nothing to empty.
struct PinnedAllocator final : at::HostAllocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = c10::alloc_cpu(std::max<size_t>(n, 1));  // a block of its own even when empty
    {
      std::lock_guard<std::mutex> lock(g_pinned_mu);
      g_pinned[static_cast<const char*>(p)] = n;
    }
    return {p, p, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

PinnedAllocator* pinned_allocator() {
  static PinnedAllocator pinned;  // lives forever
  return &pinned;
}

struct TpHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  // Must not throw or initialise anything: just ask the runtime.
  bool isAvailable() const override { return device_count() > 0; }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  // The Python package opens the runtime before loading this library.
  void init() const override {}
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }

  void setCurrentDevice(c10::DeviceIndex d) const override { set_device(d); }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    c10::DeviceIndex old = current_device();
    set_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }

  const at::Generator& getDefaultGenerator(
      c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<TpGenerator>(resolve(index), false);
  }

  // Only for pointers that are a storage's base DataPtr (a tp_storage*).
  at::Device getDeviceFromPtr(void* data) const override {
    TORCH_CHECK(data != nullptr, "null ", c10::get_privateuse1_backend(),
                " storage pointer");
    return {kTpu, static_cast<c10::DeviceIndex>(
                      tp_storage_device(static_cast<tp_storage*>(data)))};
  }

  bool isPinnedPtr(const void* p) const override { return p != nullptr && in_pinned_block(p); }
  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }

  // UntypedStorage.resize_() on a tpu storage lands here.
  void resizePrivateUse1Bytes(const c10::Storage& storage,
                              size_t nbytes) const override {
    resize_storage_bytes(storage, nbytes);
  }
};

[[maybe_unused]] const bool g_hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new TpHooks()); // lives forever
  at::setHostAllocator(kTpu, pinned_allocator());
  return true;
}();

} // namespace
} // namespace torch_pjrt

// glue.h - what the glue files share.
//
// The glue exists only because PyTorch's device extension points are C++
// classes (allocator, device guard, hooks, a few metadata kernels).  It holds
// no op logic: every computing op reaches the Python boxed fallback, which
// calls the C core.  A "tpu" tensor's storage DataPtr is an opaque
// tp_storage* (see csrc/core/storage.h); nothing here dereferences it.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

extern "C" {
#include "runtime.h"
#include "status.h"
#include "storage.h"
}

namespace torch_pjrt {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

// Devices the runtime exposes; 0 before the Python package initialised it.
// Never throws (DeviceGuardImplInterface::deviceCount must not).
c10::DeviceIndex device_count() noexcept;
// Raises c10::Error (Python RuntimeError) unless 0 <= index < device_count().
void check_device(c10::DeviceIndex index);
// The calling thread's current device (thread-local, starts at 0).
c10::DeviceIndex current_device();
// Checked set; index -1 means "leave the current device".
void set_device(c10::DeviceIndex index);

// The PrivateUse1 allocator (also reachable as c10::GetAllocator(kTpu)).
c10::Allocator* allocator();
// Whether `p` was made by allocator() (its context is a tp_storage*).
bool is_tp_data_ptr(const c10::DataPtr& p);

// Grow or shrink `storage` to `nbytes` in place via tp_storage_resize; the
// DataPtr (the tp_storage*) stays the same, so every view keeps seeing it.
// Shared by the resize_/set_ kernels and the hooks' resizePrivateUse1Bytes.
void resize_storage_bytes(const c10::Storage& storage, size_t nbytes);

// Turn an owned tp_status into a c10::Error carrying its message.
[[noreturn]] void throw_status(tp_status* st, const char* what);
// The same without a prefix, with the Python exception type the core's code
// maps to (NotImplementedError, IndexError, else RuntimeError), as the
// Python path raises it.
[[noreturn]] void raise_status(tp_status* st);

} // namespace torch_pjrt

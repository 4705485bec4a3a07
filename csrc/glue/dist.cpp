// dist.cpp - the "tpu" backend of torch.distributed (c10d).
//
// PyTorch calls a device's collectives through a c10d::Backend, a C++ class
// that only a C++ subclass can implement (c10d::Backend has no Python
// trampoline).  This one moves "tpu" tensors to host memory, runs the
// collective with Gloo, PyTorch's CPU backend, over the same store, and
// copies the results back into the "tpu" tensors.  CPU tensors go to Gloo as
// they are.  Every collective finishes before it returns (its Work is
// complete); point-to-point sends and receives do not wait.  Nothing here
// computes or keeps state beyond the Gloo backend it wraps.
//
// Why Gloo: the PJRT C API gives a program collectives across the devices of
// one client (an XLA all-reduce), not across processes, and torchrun starts
// one process per device.  On the XLA CPU plugin a device buffer is host
// memory, so the relay costs one copy each way.  See docs/architecture.md,
// "Distributed".
//
// The one glue file built apart, with Python headers (Makefile): torch.distributed
// creates backends from Python (dist.Backend.register_backend), so the class
// needs a pybind11 binding.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <ATen/ATen.h>

#include <mutex>

namespace {

bool on_tpu(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

// The copies below are not autograd's business: Gloo writes a CPU tensor's
// memory directly, parameters that require grad included, and so must the
// relay (an in-place copy_ into a leaf that requires grad would raise).
// The tensor Gloo works on: a host copy of a "tpu" tensor, else itself.
at::Tensor host(const at::Tensor& t) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return on_tpu(t) ? t.cpu() : t;
}

std::vector<at::Tensor> host(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  out.reserve(v.size());
  for (const auto& t : v) out.push_back(host(t));
  return out;
}

std::vector<std::vector<at::Tensor>> host(const std::vector<std::vector<at::Tensor>>& v) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(v.size());
  for (const auto& l : v) out.push_back(host(l));
  return out;
}

void put_back(at::Tensor& dst, const at::Tensor& src) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  if (!dst.is_same(src)) dst.copy_(src);
}

void put_back(std::vector<at::Tensor>& dst, const std::vector<at::Tensor>& src) {
  for (size_t i = 0; i < dst.size(); ++i) put_back(dst[i], src[i]);
}

void put_back(std::vector<std::vector<at::Tensor>>& dst, const std::vector<std::vector<at::Tensor>>& src) {
  for (size_t i = 0; i < dst.size(); ++i) put_back(dst[i], src[i]);
}

// A finished Work whose future holds `outputs` (DDP's reducer reads the
// reduced bucket from it).
c10::intrusive_ptr<c10d::Work> done(const std::vector<at::Tensor>& outputs) {
  auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  fut->markCompleted(c10::IValue(outputs));
  return c10d::Work::create_from_future(fut);
}

// Every output tensor, for a Work's future.
std::vector<at::Tensor> flat(const at::Tensor& t) { return {t}; }
std::vector<at::Tensor> flat(const std::vector<at::Tensor>& v) { return v; }
std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& v) {
  std::vector<at::Tensor> out;
  for (const auto& l : v) out.insert(out.end(), l.begin(), l.end());
  return out;
}

// A receive into tpu tensors, in flight: waiting on it waits for Gloo's
// receive, then copies into the tpu tensors (once; Gloo's own Work must not
// be waited on twice, a second wait waits for another message).
class Receiving final : public c10d::Work {
 public:
  Receiving(c10::intrusive_ptr<c10d::Work> gloo, std::vector<at::Tensor> dst, std::vector<at::Tensor> host)
      : c10d::Work(-1, c10d::OpType::RECV), gloo_(std::move(gloo)), dst_(std::move(dst)), host_(std::move(host)) {}

  bool wait(std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!landed_) {
      gloo_->wait(timeout);
      put_back(dst_, host_);
      landed_ = true;
    }
    return true;
  }

  bool isCompleted() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (landed_) return true;
    }
    return gloo_->isCompleted() && wait(std::chrono::milliseconds(0));  // 0: no timeout
  }

  // The sender, for a receive from any source (dist.recv(src=None)).
  int sourceRank() const override { return gloo_->sourceRank(); }

 private:
  c10::intrusive_ptr<c10d::Work> gloo_;
  std::vector<at::Tensor> dst_, host_;
  std::mutex mu_;
  bool landed_ = false;
};

bool any_on_tpu(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts)
    if (on_tpu(t)) return true;
  return false;
}

// Gloo has no AVG: it runs as SUM, and the results are divided here.
bool is_avg(const c10d::ReduceOp& op) { return op == c10d::ReduceOp::AVG; }

template <class Opts>
Opts gloo_opts(Opts opts) {
  if (is_avg(opts.reduceOp)) opts.reduceOp = c10d::ReduceOp::SUM;
  return opts;
}

void average(std::vector<at::Tensor> ts, int size) {
  for (auto& t : ts) {
    TORCH_CHECK(t.is_floating_point() || t.is_complex(),
                "ReduceOp.AVG on the tpu backend needs floating-point tensors, got ", t.scalar_type(),
                "; use ReduceOp.SUM and divide");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    t.div_(size);
  }
}

// One collective through Gloo: `run(outputs, inputs)` on host copies, waited
// for; with `divide`, the outputs divided by `size` (AVG); then the results
// copied into the tpu outputs.
template <class Outs, class Ins, class Run>
c10::intrusive_ptr<c10d::Work> relay(Outs& outs, Ins& ins, Run run, bool divide = false, int size = 1) {
  auto ho = host(outs);
  auto hi = host(ins);
  run(ho, hi)->wait();
  if (divide) average(flat(ho), size);
  put_back(outs, ho);
  return done(flat(outs));
}

// The same for a collective in place (broadcast, all_reduce, reduce): one
// host copy is its input and output.
template <class Run>
c10::intrusive_ptr<c10d::Work> relay(std::vector<at::Tensor>& ts, Run run, bool divide = false, int size = 1) {
  auto h = host(ts);
  run(h)->wait();
  if (divide) average(h, size);
  put_back(ts, h);
  return done(ts);
}

class TpuBackend final : public c10d::Backend {
 public:
  TpuBackend(c10::intrusive_ptr<c10d::Backend> gloo, int rank, int size)
      : c10d::Backend(rank, size), gloo_(std::move(gloo)) {}

  const std::string getBackendName() const override { return "tpu"; }

  using Work = c10::intrusive_ptr<c10d::Work>;
  using Tensors = std::vector<at::Tensor>;
  using TensorLists = std::vector<Tensors>;

  Work broadcast(Tensors& ts, const c10d::BroadcastOptions& o) override {
    return relay(ts, [&](Tensors& h) { return gloo_->broadcast(h, o); });
  }

  Work allreduce(Tensors& ts, const c10d::AllreduceOptions& o) override {
    return relay(ts, [&](Tensors& h) { return gloo_->allreduce(h, gloo_opts(o)); },
                 is_avg(o.reduceOp), getSize());
  }

  Work allreduce_coalesced(Tensors& ts, const c10d::AllreduceCoalescedOptions& o) override {
    return relay(ts, [&](Tensors& h) { return gloo_->allreduce_coalesced(h, gloo_opts(o)); },
                 is_avg(o.reduceOp), getSize());
  }

  Work reduce(Tensors& ts, const c10d::ReduceOptions& o) override {
    return relay(ts, [&](Tensors& h) { return gloo_->reduce(h, gloo_opts(o)); },
                 is_avg(o.reduceOp) && getRank() == o.rootRank, getSize());
  }

  Work allgather(TensorLists& outs, Tensors& ins, const c10d::AllgatherOptions& o) override {
    return relay(outs, ins, [&](TensorLists& ho, Tensors& hi) { return gloo_->allgather(ho, hi, o); });
  }

  Work _allgather_base(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& o) override {
    return relay(out, in, [&](at::Tensor& ho, at::Tensor& hi) { return gloo_->_allgather_base(ho, hi, o); });
  }

  Work allgather_coalesced(TensorLists& outs, Tensors& ins, const c10d::AllgatherOptions& o) override {
    return relay(outs, ins, [&](TensorLists& ho, Tensors& hi) { return gloo_->allgather_coalesced(ho, hi, o); });
  }

  Work allgather_into_tensor_coalesced(Tensors& outs, Tensors& ins, const c10d::AllgatherOptions& o) override {
    return relay(outs, ins,
                 [&](Tensors& ho, Tensors& hi) { return gloo_->allgather_into_tensor_coalesced(ho, hi, o); });
  }

  Work gather(TensorLists& outs, Tensors& ins, const c10d::GatherOptions& o) override {
    return relay(outs, ins, [&](TensorLists& ho, Tensors& hi) { return gloo_->gather(ho, hi, o); });
  }

  Work scatter(Tensors& outs, TensorLists& ins, const c10d::ScatterOptions& o) override {
    return relay(outs, ins, [&](Tensors& ho, TensorLists& hi) { return gloo_->scatter(ho, hi, o); });
  }

  Work reduce_scatter(Tensors& outs, TensorLists& ins, const c10d::ReduceScatterOptions& o) override {
    return relay(outs, ins, [&](Tensors& ho, TensorLists& hi) { return gloo_->reduce_scatter(ho, hi, gloo_opts(o)); },
                 is_avg(o.reduceOp), getSize());
  }

  Work _reduce_scatter_base(at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& o) override {
    return relay(out, in,
                 [&](at::Tensor& ho, at::Tensor& hi) { return gloo_->_reduce_scatter_base(ho, hi, gloo_opts(o)); },
                 is_avg(o.reduceOp), getSize());
  }

  Work reduce_scatter_tensor_coalesced(Tensors& outs, Tensors& ins, const c10d::ReduceScatterOptions& o) override {
    return relay(outs, ins,
                 [&](Tensors& ho, Tensors& hi) { return gloo_->reduce_scatter_tensor_coalesced(ho, hi, gloo_opts(o)); },
                 is_avg(o.reduceOp), getSize());
  }

  Work alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                     std::vector<int64_t>& in_splits, const c10d::AllToAllOptions& o) override {
    return relay(out, in, [&](at::Tensor& ho, at::Tensor& hi) {
      return gloo_->alltoall_base(ho, hi, out_splits, in_splits, o);
    });
  }

  Work alltoall(Tensors& outs, Tensors& ins, const c10d::AllToAllOptions& o) override {
    return relay(outs, ins, [&](Tensors& ho, Tensors& hi) { return gloo_->alltoall(ho, hi, o); });
  }

  // Point-to-point calls do not wait (isend, then recv, from both ends of a
  // pair must not deadlock): a send hands Gloo a host copy that its Work
  // keeps alive; a receive into tpu tensors copies them in when waited on.
  Work send(Tensors& ts, int dst, int tag) override {
    auto h = host(ts);
    return gloo_->send(h, dst, tag);
  }

  Work recv(Tensors& ts, int src, int tag) override {
    auto h = host(ts);
    auto w = gloo_->recv(h, src, tag);
    if (!any_on_tpu(ts)) return w;
    return c10::make_intrusive<Receiving>(w, ts, h);
  }

  Work recvAnysource(Tensors& ts, int tag) override {
    auto h = host(ts);
    auto w = gloo_->recvAnysource(h, tag);
    if (!any_on_tpu(ts)) return w;
    return c10::make_intrusive<Receiving>(w, ts, h);
  }

  Work barrier(const c10d::BarrierOptions& o) override {
    gloo_->barrier(o)->wait();
    return done({});
  }

  void monitoredBarrier(const c10d::BarrierOptions& o, bool wait_all_ranks) override {
    gloo_->monitoredBarrier(o, wait_all_ranks);
  }

  void setSequenceNumberForGroup() override { gloo_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return gloo_->getSequenceNumberForGroup(); }

 private:
  c10::intrusive_ptr<c10d::Backend> gloo_;
};

}  // namespace

PYBIND11_MODULE(_dist, m) {
  pybind11::module_::import("torch._C._distributed_c10d");
  pybind11::class_<TpuBackend, c10d::Backend, c10::intrusive_ptr<TpuBackend>>(m, "TpuBackend")
      .def(pybind11::init<c10::intrusive_ptr<c10d::Backend>, int, int>(), pybind11::arg("gloo"),
           pybind11::arg("rank"), pybind11::arg("size"));
}

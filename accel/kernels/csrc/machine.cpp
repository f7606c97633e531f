// machine.cpp: the machine probe (core-to-core latency) and weights in 2 MB pages.
#include "machine.h"
#include <sys/mman.h>

// ---- machine probe ------------------------------------------------------------------------------------------
// Two threads pass a counter back and forth through one cache line `rounds` times: ns per one-way pass (0 with one
// thread). Where a VM's vCPUs sit on two CCDs this is several times what it is on one: then each core has its own
// link to memory (more read bandwidth) and every exchange between threads costs more (accel.bench.probes).
double core_to_core_ns(int64_t rounds) {
  TORCH_CHECK(rounds >= 1, "rounds must be >= 1, got ", rounds);
  alignas(64) std::atomic<int64_t> flag{0};
  double ns = 0;
#pragma omp parallel num_threads(2)
  if (omp_get_num_threads() == 2) {
    const int rank = omp_get_thread_num();
#pragma omp barrier
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < rounds; ++i) {
      if (rank == 0) {
        flag.store(2 * i + 1, std::memory_order_release);
        while (flag.load(std::memory_order_acquire) != 2 * i + 2) {}
      } else {
        while (flag.load(std::memory_order_acquire) != 2 * i + 1) {}
        flag.store(2 * i + 2, std::memory_order_release);
      }
    }
    if (rank == 0) ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / (2 * rounds);
  }
  return ns;
}

// ---- weights in 2 MB pages ----------------------------------------------------------------------------------
// A decode step streams every weight once; with 4 KB pages that is a TLB miss every 4 KB, which held the fp32
// step's weight stream well below its rate on 2 MB pages. torch's allocator asks for huge pages only
// under THP_MEM_ALLOC_ENABLE, read once at its first allocation, so large tensors are copied into an anonymous
// mapping advised MADV_HUGEPAGE before it is first touched (the kernel then backs it with 2 MB pages where it can;
// where it cannot, this is an ordinary copy).
torch::Tensor huge_page_copy(torch::Tensor t) {
  t = t.contiguous();
  const size_t bytes = t.numel() * t.element_size();
  const size_t huge = size_t(2) << 20, len = (bytes + huge - 1) / huge * huge;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return t;
  madvise(p, len, MADV_HUGEPAGE);
  std::memcpy(p, t.data_ptr(), bytes);
  return torch::from_blob(p, t.sizes(), [len](void* q) { munmap(q, len); }, t.options());
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux >= 5.14; older kernels answer EINVAL and the pages are touched instead
#endif

// zeros [sizes] of `like`'s dtype in memory advised for 2 MB pages (an anonymous mapping reads as zeros), faulted in
// here, as torch.zeros' memset does and as vLLM and llama.cpp clear their KV buffers at startup. Left to fault on
// first use, a KV cache's pages arrived inside decode steps, each a 2 MB page allocation that may compact memory
// while the other thread of the step waited: an engine's first run of long-tailed requests was slower than with the
// cache faulted in beforehand.
torch::Tensor huge_page_zeros(std::vector<int64_t> sizes, torch::Tensor like) {
  int64_t n = 1;
  for (auto v : sizes) n *= v;
  const size_t bytes = n * like.element_size();
  const size_t huge = size_t(2) << 20, len = std::max<size_t>(huge, (bytes + huge - 1) / huge * huge);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return torch::zeros(sizes, like.options());
  madvise(p, len, MADV_HUGEPAGE);
  if (madvise(p, len, MADV_POPULATE_WRITE) != 0)
    for (size_t i = 0; i < len; i += 4096) static_cast<volatile char*>(p)[i] = 0;
  return torch::from_blob(p, sizes, [len](void* q) { munmap(q, len); }, like.options());
}

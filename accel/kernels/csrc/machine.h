// machine.h: the machine probe and memory in 2 MB pages (machine.cpp).
#pragma once

#include "common.h"

#pragma GCC visibility push(hidden)

// ns per one-way pass of a cache line between two threads (0 with one thread)
double core_to_core_ns(int64_t rounds);
// a copy of t in memory advised for 2 MB pages (t itself where the mapping fails)
torch::Tensor huge_page_copy(torch::Tensor t);
// zeros [sizes] of `like`'s dtype in memory advised for 2 MB pages, faulted in
torch::Tensor huge_page_zeros(std::vector<int64_t> sizes, torch::Tensor like);

#pragma GCC visibility pop

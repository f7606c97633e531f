// bindings.cpp: the Python bindings.
#include <torch/python.h>
#include "attention.h"
#include "decode_step.h"
#include "gemm_f32.h"
#include "gemm_int4.h"
#include "gemm_int8.h"
#include "gemm_vnni.h"
#include "machine.h"
#include "norms_rope.h"
#include "spec_steps.h"
#include "threads.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("huge_page_copy", &huge_page_copy, "a copy of a tensor in memory advised for 2 MB pages");
  m.def("huge_page_zeros", &huge_page_zeros, "zeros in memory advised for 2 MB pages, faulted in");
  m.def("kv_write_", &kv_write_, "k/v rows into flat cache slots");
  m.def("int4_linear_vnni", &int4_linear_vnni, "int4_linear with q and scale_min in the VNNI tile layout", py::call_guard<py::gil_scoped_release>());
  m.def("int4a8_linear_vnni", &int4a8_linear_vnni, "int4_linear_vnni with 8-bit activation blocks, q in the a8 tile layout", py::call_guard<py::gil_scoped_release>());
  m.def("int8_linear_vnni", &int8_linear_vnni, "int8_linear with q (and gs) in the VNNI tile layout", py::call_guard<py::gil_scoped_release>());
  m.def("int8_linear", &int8_linear, "y = (x @ q^T) * scale; x fp32 [M, K], q int8 [N, K], scale fp32 [N], gs fp16 [N, K / 32] group scales or empty, a8: x as W8A8's 8-bit rows", py::call_guard<py::gil_scoped_release>());
  m.def("int4_linear", &int4_linear, "y[m, n] = sum_k x[m, k] * (q[n, k] * sm[n, g, 0] + sm[n, g, 1])", py::call_guard<py::gil_scoped_release>());
  m.def("core_to_core_ns", &core_to_core_ns, "ns per one-way pass of a cache line between two threads", py::call_guard<py::gil_scoped_release>());
  m.def("governor_trace", &governor_trace, "test hook: the decode step's team sizes over steps of injected costs");
  m.def("team_chunks", &team_chunks, "test hook: the thread that ran each chunk, one thread started late");
  m.def("argmax_rows", &argmax_rows, "each fp32 row's argmax, as torch.argmax");
  m.def("has_vnni", []() { return HAS_VNNI; }, "whether the AVX512-VNNI kernels (and the prefill GEMM) run here");
  m.def("int4_dequant", &int4_dequant, "w[n0:n1] = q * sm[n, g, 0] + sm[n, g, 1] in fp32", py::call_guard<py::gil_scoped_release>());
  m.def("has_avx512", []() { return HAS_AVX512; }, "whether the fp32 panel kernels run here");
  m.def("f32_panel_linear", &f32_panel_linear, "y = x @ w^T with w in fp32 panels [ceil(N / 48), K, 48]",
        py::call_guard<py::gil_scoped_release>());
  m.def("f32_linear", &f32_linear, "y = x @ w^T for a few fp32 rows", py::call_guard<py::gil_scoped_release>());
  m.def("rms_norm", &rms_norm, "RMSNorm of fp32 rows");
  m.def("paged_decode_attention", &paged_decode_attention, "decode attention over a paged fp32 KV cache", py::call_guard<py::gil_scoped_release>());
  m.def("add_rms_norm_", &add_rms_norm_, "residual += x; return RMSNorm(residual)");
  m.def("silu_mul", &silu_mul, "silu(gate) * up of a fused [T, 2I] gate_up output");
  m.def("gelu_tanh_mul", &gelu_tanh_mul, "gelu_tanh(gate) * up of a fused [T, 2I] gate_up output");
  m.def("rope_", &rope_, "RoPE in place on the first nheads heads of each row");
  // the GIL is released while a step runs, so the server's event loop streams the previous step's tokens meanwhile
  // module-local: builds of other sources (each named by its hash) can be loaded side by side, as A/B checks do
  py::class_<DecodeTensors>(m, "DecodeTensors", py::module_local(),
                            "a model's decode-step weights and KV caches for decode_layers")
      .def(py::init<std::vector<torch::Tensor>, std::vector<int64_t>>())
      .def("bind_caches", &DecodeTensors::bind_caches, "the KV caches decode_layers writes and reads")
      .def("set_head", &DecodeTensors::set_head, "the lm_head decode_layers runs on its logit_rows")
      .def("set_input_proj", &DecodeTensors::set_input_proj, "a projection decode_layers runs on x first")
      .def("set_tables", &DecodeTensors::set_tables, "the embedding and RoPE tables decode_layers gathers rows from")
      .def("set_local_rope", &DecodeTensors::set_local_rope, "the RoPE table of the layers on table 1");
  m.def("decode_layers", &decode_layers, "every decoder layer of a decode step, one call",
        py::call_guard<py::gil_scoped_release>());
  m.def("decode_step", &decode_step, "decode_layers with the step's indices as lists of ints",
        py::call_guard<py::gil_scoped_release>());
  m.def("decode_steps", &decode_steps, "greedy decode steps, each step's argmax the next one's input",
        py::call_guard<py::gil_scoped_release>());
  m.def("spec_steps", &spec_steps, "greedy n-gram speculation of one request, several verify steps",
        py::call_guard<py::gil_scoped_release>());
  py::class_<SpecPolicy>(m, "SpecPolicy", "the batch-1 draft-length rule and its acceptance state")
      .def(py::init<>())
      .def_readwrite("successes", &SpecPolicy::successes)
      .def_readwrite("failures", &SpecPolicy::failures)
      .def_readwrite("decay", &SpecPolicy::decay)
      .def_readwrite("cost_ratio", &SpecPolicy::cost_ratio)
      .def_readwrite("k_max", &SpecPolicy::k_max)
      .def_readwrite("last_full", &SpecPolicy::last_full)
      .def_readwrite("fixed_k", &SpecPolicy::fixed_k)
      .def("length", &SpecPolicy::length)
      .def("observe", &SpecPolicy::observe);
}

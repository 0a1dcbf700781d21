// FlashInfer's sampling kernels (include/flashinfer/sampling.cuh of a flashinfer-python wheel)
// as a torch extension for bench_sampling.py's peer columns: the softmax, then sampling from the
// probabilities with top-k, top-p or both, as vLLM's FlashInfer sampler calls them (deterministic,
// a fixed seed and offset). Built by flashinfer_peer.py; not part of the engine.
//
// torch's extension builder defines these; FlashInfer's vector types need the conversions
#undef __CUDA_NO_HALF_OPERATORS__
#undef __CUDA_NO_HALF_CONVERSIONS__
#undef __CUDA_NO_BFLOAT16_CONVERSIONS__
#undef __CUDA_NO_HALF2_OPERATORS__

#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <flashinfer/sampling.cuh>

namespace fs = flashinfer::sampling;

namespace {

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.is_contiguous() && t.dim() == 2 && t.scalar_type() == at::kFloat, name,
              ": expected a contiguous float32 [B, V] CUDA tensor");
}

void check_status(cudaError_t status, const char* what) {
  TORCH_CHECK(status == cudaSuccess, what, " failed: ", cudaGetErrorString(status));
}

// softmax(logits) -> probs, FlashInfer's online softmax (workspace: a uint8 CUDA buffer)
at::Tensor softmax(const at::Tensor& logits, const at::Tensor& workspace) {
  check_rows(logits, "logits");
  auto probs = at::empty_like(logits);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  check_status(fs::OnlineSoftmax<float>(logits.data_ptr<float>(), probs.data_ptr<float>(),
                                        static_cast<uint32_t>(logits.size(0)),
                                        static_cast<uint32_t>(logits.size(1)), nullptr, 1.0f,
                                        workspace.data_ptr(),
                                        static_cast<size_t>(workspace.numel()), false, stream),
               "OnlineSoftmax");
  return probs;
}

// one token a row from probs under top_k (0: off) and top_p (1: off) -> int32 [B]
at::Tensor sample(const at::Tensor& probs, int64_t top_k, double top_p, int64_t seed, int64_t offset) {
  check_rows(probs, "probs");
  const uint32_t B = static_cast<uint32_t>(probs.size(0)), V = static_cast<uint32_t>(probs.size(1));
  auto out = at::empty({probs.size(0)}, probs.options().dtype(at::kInt));
  auto valid = at::empty({probs.size(0)}, probs.options().dtype(at::kBool));
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  float* p = probs.data_ptr<float>();
  int32_t* o = out.data_ptr<int32_t>();
  bool* ok = valid.data_ptr<bool>();
  const uint64_t s = static_cast<uint64_t>(seed), f = static_cast<uint64_t>(offset);
  if (top_k > 0 && top_p < 1.0) {
    check_status(fs::TopKTopPSamplingFromProb<float, int32_t>(
                     p, nullptr, nullptr, o, ok, nullptr, B, static_cast<int32_t>(top_k),
                     static_cast<float>(top_p), V, true, nullptr, s, nullptr, f, stream),
                 "TopKTopPSamplingFromProb");
  } else if (top_k > 0) {
    check_status(fs::TopKSamplingFromProb<float, int32_t>(p, o, ok, nullptr, nullptr, B,
                                                         static_cast<uint32_t>(top_k), V, true,
                                                         nullptr, s, nullptr, f, stream),
                 "TopKSamplingFromProb");
  } else if (top_p < 1.0) {
    check_status(fs::TopPSamplingFromProb<float, int32_t>(p, o, ok, nullptr, nullptr, B,
                                                         static_cast<float>(top_p), V, true,
                                                         nullptr, s, nullptr, f, stream),
                 "TopPSamplingFromProb");
  } else {
    check_status(fs::SamplingFromProb<float, int32_t>(p, o, ok, nullptr, B, V, true, nullptr, s,
                                                     nullptr, f, stream),
                 "SamplingFromProb");
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("softmax", &softmax, "FlashInfer's online softmax of float32 [B, V] logits");
  m.def("sample", &sample, "FlashInfer's sampling from float32 [B, V] probabilities (top_k, top_p)");
}

#include "backend/cuda/weights.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"
#include "core/quant.h"

namespace arbiter::cuda {

size_t WeightCache::KeyHash::operator()(const Key& k) const {
  return std::hash<const void*>()(k.data) ^ (k.sample * 0x9e3779b97f4a7c15ull) ^ size_t(k.numel);
}

WeightCache::Key WeightCache::key_of(const Tensor& t) {
  const size_t n = t.nbytes();
  const auto* p = static_cast<const uint8_t*>(t.data);
  uint64_t h = 1469598103934665603ull;  // FNV-1a over 4 samples of up to 16 bytes
  const size_t offs[4] = {0, n / 3, 2 * n / 3, n >= 16 ? n - 16 : 0};
  for (size_t off : offs)
    for (size_t i = off; i < std::min(n, off + 16); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return Key{t.data, t.numel(), t.cols(), t.dtype, h};
}

WeightCache::~WeightCache() {
  cudaStreamSynchronize(stream_);
  for (auto& [k, m] : mats_) cudaFree(m.ptr);
  for (auto& [k, v] : vecs_) cudaFree(v.ptr);
  cudaFree(staging_.ptr);
}

void WeightCache::prepare(const std::vector<const Tensor*>& weights) {
  std::unordered_map<Key, bool, KeyHash> keep;
  for (const Tensor* t : weights) keep[key_of(*t)] = true;
  ARB_CUDA(cudaStreamSynchronize(stream_));
  for (auto it = mats_.begin(); it != mats_.end();)
    if (keep.count(it->first)) ++it;
    else {
      cudaFree(it->second.ptr);
      it = mats_.erase(it);
    }
  auto kept = [&](Key k) {  // a 1 + w vector stays with its weight
    k.plus_one = false;
    return keep.count(k) > 0;
  };
  for (auto it = vecs_.begin(); it != vecs_.end();)
    if (kept(it->first)) ++it;
    else {
      cudaFree(it->second.ptr);
      it = vecs_.erase(it);
    }
  for (const Tensor* t : weights) {
    const size_t dims = t->shape.size();
    if (dims == 2) matrix(*t);
    else if (dims == 1 || (dims == 3 && t->shape[1] == 1)) vector(*t);  // conv1d [C, 1, K]
    // Other 3-D weights are stacks of expert matrices (Granite's [E, 2F, D]): the model reads
    // them as row slices, each uploaded as a matrix of its own at its first use.
  }
  // The staging block is as large as the largest weight; give it back.
  ARB_CUDA(cudaStreamSynchronize(stream_));
  ARB_CUDA(cudaFree(staging_.ptr));
  staging_ = DevBuf{};
}

const DevMat& WeightCache::matrix(const Tensor& t, bool dense) {
  Key key = key_of(t);
  key.dense = dense && packed_on_device(t.dtype);
  auto it = mats_.find(key);
  if (it != mats_.end()) return it->second;
  ARB_CHECK(!t.empty() && t.shape.size() <= 2, "[cuda] weight '%s': expected a matrix",
            t.name.c_str());
  if (packed_on_device(t.dtype) && !dense) return mats_.emplace(key, upload_packed(t)).first->second;
  DevMat m;
  m.st = ct_;
  m.rows = t.rows();
  m.cols = t.cols();
  const int64_t align = int64_t(16 / elem_size(ct_));
  m.ld = (m.cols + align - 1) / align * align;
  DType st;
  const void* src = upload_raw(t, st);
  ARB_CUDA(cudaMalloc(&m.ptr, size_t(m.rows * m.ld) * elem_size(ct_)));
  launch_convert_matrix(st, src, m.rows, m.cols, ct_, m.ptr, m.ld, stream_);
  ARB_CUDA(cudaStreamSynchronize(stream_));
  return mats_.emplace(key, m).first->second;
}

DevMat WeightCache::upload_packed(const Tensor& t) {
  const int64_t be = block_elems(t.dtype);
  ARB_CHECK(t.cols() % be == 0, "[cuda] weight '%s': %s rows of %lld values (need a multiple of %lld)",
            t.name.c_str(), dtype_name(t.dtype), (long long)t.cols(), (long long)be);
  DevMat m;
  m.st = t.dtype;
  m.rows = t.rows();
  m.cols = t.cols();
  const size_t row_bytes = size_t(t.cols() / be) * block_bytes(t.dtype);
  m.ld = int64_t((row_bytes + 15) / 16 * 16);
  const size_t bytes = size_t(m.rows) * size_t(m.ld);
  ARB_CUDA(cudaMalloc(&m.ptr, std::max<size_t>(bytes, 16)));
  // The padding is zeroed: a row's last 16-byte load reads it (and never uses it).
  ARB_CUDA(cudaMemsetAsync(m.ptr, 0, bytes, stream_));
  ARB_CUDA(cudaMemcpy2DAsync(m.ptr, size_t(m.ld), t.data, row_bytes, row_bytes, size_t(m.rows),
                             cudaMemcpyHostToDevice, stream_));
  ARB_CUDA(cudaStreamSynchronize(stream_));
  return m;
}

const DevVec& WeightCache::vector(const Tensor& t, bool plus_one) {
  Key key = key_of(t);
  key.plus_one = plus_one;
  auto it = vecs_.find(key);
  if (it != vecs_.end()) return it->second;
  ARB_CHECK(!t.empty(), "[cuda] weight '%s' is missing", t.name.c_str());
  DevVec v;
  v.n = t.numel();
  DType st;
  const void* src = upload_raw(t, st);
  ARB_CUDA(cudaMalloc(&v.ptr, size_t(v.n) * sizeof(float)));
  launch_convert_vector(st, src, v.n, plus_one, v.ptr, stream_);
  ARB_CUDA(cudaStreamSynchronize(stream_));
  return vecs_.emplace(key, v).first->second;
}

const void* WeightCache::upload_raw(const Tensor& t, DType& st) {
  std::vector<float> widened;
  const void* src = t.data;
  size_t bytes = t.nbytes();
  switch (t.dtype) {
    case DType::F32: st = DType::F32; break;
    case DType::F16: st = DType::F16; break;
    case DType::BF16: st = DType::BF16; break;
    case DType::Q8_0:
      ARB_CHECK(t.cols() % kQ8BlockSize == 0,
                "[cuda] weight '%s': Q8_0 rows of %lld values (need a multiple of 32)",
                t.name.c_str(), (long long)t.cols());
      st = DType::Q8_0;
      break;
    default:
      // F64, MLX's blocks and the dense copies of the ggml formats (matrix(t, true), for the
      // MoE kernels): widened on the host to f32 (each value the exact one rounded once), then
      // rounded to the compute type as f32 weights are.
      widened.resize(size_t(t.numel()));
      row_to_f32(t.dtype, t.data, widened.data(), t.numel());
      src = widened.data();
      bytes = widened.size() * sizeof(float);
      st = DType::F32;
      break;
  }
  if (staging_.bytes < bytes) {
    ARB_CUDA(cudaStreamSynchronize(stream_));
    ARB_CUDA(cudaFree(staging_.ptr));
    staging_ = DevBuf{};
    ARB_CUDA(cudaMalloc(&staging_.ptr, bytes));
    staging_.bytes = bytes;
  }
  ARB_CUDA(cudaMemcpyAsync(staging_.ptr, src, bytes, cudaMemcpyHostToDevice, stream_));
  ARB_CUDA(cudaStreamSynchronize(stream_));  // widened (if any) dies at return
  return staging_.ptr;
}

}  // namespace arbiter::cuda

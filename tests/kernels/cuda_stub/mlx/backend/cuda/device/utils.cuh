// The parts of MLX's device/utils.cuh that JIT-compiled custom kernels can see and that the
// catalog relies on (Shape/Strides, fp16/bf16 types), for compiling rendered CUDA with nvcc.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cuda/std/limits>
#include <cstdint>

#define MAX_NDIM 10

namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, MAX_NDIM>;
using Strides = cuda::std::array<int64_t, MAX_NDIM>;
}  // namespace mlx::core::cu

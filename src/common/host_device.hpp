// SPDX-License-Identifier: Apache-2.0
// Marks helpers that both the CPU backend and CUDA kernels compile.
#pragma once

#if defined(__CUDACC__)
#define ATTNKIT_HD __host__ __device__ __forceinline__
#else
#define ATTNKIT_HD inline
#endif

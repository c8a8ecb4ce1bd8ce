// SPDX-License-Identifier: Apache-2.0
// Programmatic dependent launch (sm_90): a kernel launched with the stream attribute
// cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled while the kernel before
// it in the stream still runs, once that one's CTAs have all called allow_dependent_launch (or
// exited). Its own launch latency then overlaps the other's work; it must call
// wait_for_prior_grid before it reads anything the other writes, which returns once that grid
// has completed and its writes are visible. Both are no-ops in code compiled for older GPUs,
// where the host must not set the attribute (the kernel would not wait).
#pragma once

namespace attnkit::detail::cuda {

/// Lets the dependent kernel be scheduled now: safe from a kernel's first instruction, since
/// the dependent still waits for this grid's completion (wait_for_prior_grid).
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Waits until the kernel before this one in the stream has completed and its writes are
/// visible (at once when this kernel was launched without the attribute).
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace attnkit::detail::cuda

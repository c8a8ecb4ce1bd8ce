# SPDX-License-Identifier: Apache-2.0
"""One attnkit.topk call per case, for a profiler (ncu) to capture: a streaming-bound case
(fp32 [256, 129280], k = 50) and a select-bound one (bf16 [4096, 8192], k = 512)."""

import torch

import attnkit

for dtype, b, n, k in ((torch.float32, 256, 129280, 50), (torch.bfloat16, 4096, 8192, 512)):
    x = torch.randn(b, n, device="cuda").to(dtype)
    attnkit.topk(x, k, indices_dtype=torch.int32)
torch.cuda.synchronize()

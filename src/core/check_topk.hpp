// SPDX-License-Identifier: Apache-2.0
// The one place where topk's arguments are checked (SPEC: Bad input).
#pragma once

#include "attnkit/topk.hpp"
#include "core/topk_problem.hpp"

namespace attnkit::detail {

/// Checks the rules on x, k, the options, begin, end and index_offset (every rule that needs
/// neither the outputs nor per-row data) and returns the problem without its outputs.
/// \throws Error naming the argument, the value seen and the rule.
TopkProblem check_topk_inputs(const TopkTensors& tensors, const TopkOptions& options);

/// Checks every rule that needs no per-row data and returns the flattened problem.
/// \throws Error naming the argument, the value seen and the rule.
TopkProblem check_topk(const TopkTensors& tensors, const TopkOptions& options);

/// Checks the per-row values: 0 <= begin[b] <= end[b] <= N, and every index plus
/// index_offset[b] fits the index dtype. The RowVectors must point at host memory.
void check_topk_row_values(const TopkProblem& p, const RowVector& begin, const RowVector& end,
                           const RowVector& index_offset);

}  // namespace attnkit::detail

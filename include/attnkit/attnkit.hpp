// SPDX-License-Identifier: Apache-2.0
/// \file
/// Umbrella header: everything a C++ user of attnkit needs.
#pragma once

#include "attnkit/error.hpp"
#include "attnkit/runtime.hpp"
#include "attnkit/tensor.hpp"
#include "attnkit/topk.hpp"

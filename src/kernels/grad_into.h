// Where a backward op puts the gradient of its input (the activation gradient, never a parameter
// gradient): added to what the buffer holds (kAdd, the meaning of kernels/ops.h, so micro-batches
// and branches accumulate) or written over it (kWrite: the buffer's old contents are neither read
// nor kept, so a caller that would have zeroed it first saves that pass and the read).
#pragma once

namespace atl::kernels {

enum class GradInto { kAdd, kWrite };

}  // namespace atl::kernels

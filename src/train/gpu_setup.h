// The GPU's process-wide settings a run sets before it trains (train.device = cuda): the
// products' precision (train.precision), and the tensor-core attention's backward kind
// (train.attention_backward) and block rows (train.attention_rows, "auto": timed here, one choice
// for the site). Every run sets them all, so runs that follow one another in a process (tests,
// replays) each get their own.
//
// Thread-safety: the process's GPU thread only.
#pragma once

#include "core/status.h"
#include "parallel/mesh.h"
#include "train/config.h"

namespace atl {

// Sets them for this rank. "auto" rows: every rank of the site times the four settings at its own
// shape of the attention (micro-batch, seq_len, its heads under tp), the times are summed over
// the site's ranks (collective over me.world(): every rank of the site calls this), and each rank
// sets kernels::ChooseAttentionBlockRows of the sums: the same setting everywhere. Where a rank
// does not time (float products, heads over 64, the CUDA emulator, a timing that failed: logged),
// every rank keeps the default. Rank 0 logs what was chosen and why. InvalidArgument for a
// setting that does not parse (a config not checked by ValidateRunConfig).
Status SetUpGpu(const RunConfig& cfg, const Mesh& me);

}  // namespace atl

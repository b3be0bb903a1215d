// In-process backend: N ranks as N threads of one process, for unit tests of everything above
// comm/ (the mesh, data/tensor/pipeline parallel) without mpirun.
//
// Reductions are deterministic: element i of a sum is ((x0 + x1) + x2) + ... in rank order
// 0..N-1, computed by whichever rank arrives last, so the result is bitwise the same whatever the
// threads' timing. (The reproducible reduction mode of parallel/ builds on this property.)
//
// Failures never hang: every Wait() gives up after `timeout_s` with an error naming the operation
// and the ranks that have not arrived; a rank whose Communicator is destroyed "leaves", and any
// collective it has not joined (or a Recv from it with no message queued) fails at once with
// "rank K left the group". Mismatched collectives (different op, count, dtype or root at the same
// position in the call order) fail on every rank with a message naming both calls.
//
// Thread-safety: one Communicator per thread (its rank); the group's shared state is locked.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace atl {

struct InProcessOptions {
  // How long Wait() waits for the other ranks before returning an error. Generous by default: a
  // slow rank on an oversubscribed machine is not a dead one. Tests of failures set it low.
  double timeout_s = 60.0;
};

// `size` communicators of one group; hand communicator i to the thread that plays rank i.
std::vector<std::unique_ptr<Communicator>> CreateInProcessGroup(int size,
                                                                InProcessOptions options = {});

// Runs fn(rank's communicator) on `size` threads, one per rank, and returns each rank's status.
// Each rank's Communicator is destroyed when its fn returns (so a rank that returns early
// "leaves").
std::vector<Status> RunInProcessRanks(int size, const std::function<Status(Communicator&)>& fn,
                                      InProcessOptions options = {});

}  // namespace atl

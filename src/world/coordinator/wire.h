// The coordinator's messages on the wire (world/proto/coordinator.proto) and back: shared by the
// server and the client.
//
// Thread-safety: functions on values.
#pragma once

#include "world/coordinator.h"
#include "world/proto/coordinator.pb.h"

namespace atl {

inline void ToProto(const Membership& m, coord::Membership* p) {
  p->set_epoch(m.epoch);
  for (const auto& s : m.sites) {
    auto* q = p->add_sites();
    q->set_site(s.site);
    q->set_wan_address(s.wan_address);
    q->set_alive(s.alive);
    q->set_last_round(s.last_round);
    q->set_join_round(s.join_round);
    q->set_left(s.left);
    q->set_epoch(s.epoch);
  }
  for (const auto& [site, v] : m.votes) {
    auto* q = p->add_votes();
    q->set_site(site);
    q->set_failed(v.failed);
    q->set_digest(v.digest);
    q->set_seconds(v.seconds);
  }
}

inline Membership FromProto(const coord::Membership& p) {
  Membership m;
  m.epoch = p.epoch();
  for (const auto& q : p.sites())
    m.sites.push_back({q.site(), q.wan_address(), q.alive(), q.last_round(), q.join_round(),
                       q.left(), q.epoch()});
  for (const auto& q : p.votes())
    m.votes[q.site()] = RoundVote{q.failed(), q.digest(), q.seconds()};
  return m;
}

}  // namespace atl

// Certificates for a world (what `atoll certs` writes; world/security.h reads them).
//
// MakeCerts(dir, sites) creates a private CA and, signed by it, one certificate per party:
//   DIR/ca.pem, DIR/ca.key                        the CA (CN "atoll CA", CA:TRUE)
//   DIR/coordinator.pem, DIR/coordinator.key      the coordinator
//   DIR/site-N.pem, DIR/site-N.key, N in [0, sites)
//   DIR/token                                     the shared token: 32 random bytes in hex
// Keys are EC P-256 (PKCS#8 PEM); party certificates have CN "atoll" (OU the party's name) and
// subjectAltName DNS:atoll (kTlsName), extended key usage serverAuth + clientAuth, and are valid
// from an hour ago for 10 years. Keys and token are written 0600, certificates 0644, each file
// atomically (temp file, fsync, rename); the directory is created 0700.
//
// Copy ca.pem, token and a party's NAME.pem/NAME.key to the machine that runs that party; ca.key
// need not leave the machine that made it (it only signs more certificates).
//
// Thread-safety: a pure function of its arguments (and the random source).
#pragma once

#include <string>

#include "core/status.h"

namespace atl {

// InvalidArgument when sites < 1 or DIR exists and is not empty (unless `force`: files are
// then replaced; unrelated files are left alone). Internal for an OpenSSL failure.
Status MakeCerts(const std::string& dir, int sites, bool force = false);

}  // namespace atl

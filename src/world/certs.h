// Certificates for a world (what `atoll certs` writes; world/security.h reads them).
//
// MakeCerts(dir, sites) creates a private CA and, signed by it, one certificate per party:
//   DIR-ca/ca.pem, DIR-ca/ca.key, DIR-ca/token    the CA (CN "atoll CA", CA:TRUE), its key and
//                                                 the world's token: the authority's directory,
//                                                 beside DIR (not in it: DIR is what is copied)
//   DIR/ca.pem, DIR/token                         what every party needs: the CA certificate and
//                                                 the shared token (32 random bytes in hex)
//   DIR/coordinator.pem, DIR/coordinator.key      the coordinator
//   DIR/site-N.pem, DIR/site-N.key, N in [0, sites)
// IssueCert(DIR-ca, party, OUT) signs one more party's certificate (a site on another host, a
// replacement) into OUT: OUT/ca.pem, OUT/token, OUT/PARTY.pem, OUT/PARTY.key; OUT never gets the
// CA key (an OUT that holds one is refused, and so is one holding another world's ca.pem or
// token, unless `force`).
// Keys are EC P-256 (PKCS#8 PEM); a party's certificate names it: CN and subjectAltName DNS
// "coordinator" or "site-N" (world/security.h: clients verify the server's name, servers the
// caller's), extended key usage serverAuth + clientAuth, valid from an hour ago for 10 years.
// Keys and token are written 0600, certificates 0644, each file atomically (temp file, fsync,
// rename); directories are created 0700.
//
// Copy ca.pem, token and a party's NAME.pem/NAME.key to the machine that runs that party; DIR-ca
// need not leave the machine that made it (it only signs more certificates).
//
// Thread-safety: a pure function of its arguments (and the random source).
#pragma once

#include <string>

#include "core/status.h"

namespace atl {

// The authority's directory MakeCerts makes for DIR: DIR-ca beside it (DIR absolute, without a
// trailing slash).
std::string DefaultCaDir(const std::string& dir);

// InvalidArgument when sites < 1 or DIR exists and is not empty (unless `force`: files are
// then replaced; unrelated files are left alone). Internal for an OpenSSL failure.
// ca_dir: the authority's directory (empty: DefaultCaDir(DIR)).
Status MakeCerts(const std::string& dir, int sites, bool force = false, std::string ca_dir = "");
// InvalidArgument for a party that is not "coordinator" or "site-N", an existing OUT/PARTY.key
// (unless `force`) or an OUT holding ca.key; NotFound naming the file CA_DIR lacks.
Status IssueCert(const std::string& ca_dir, const std::string& party, const std::string& out,
                 bool force = false);

}  // namespace atl

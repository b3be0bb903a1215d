#include "data/reference.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/file.h"

#ifndef ATOLL_BUILD_SOURCE_DIR
#define ATOLL_BUILD_SOURCE_DIR ""
#endif

namespace atl {

namespace {

constexpr const char* kSetupHint = "run scripts/setup.sh to install node and the npm data";

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Runs one node process over `files`, returning its stdout.
StatusOr<std::string> RunNode(const std::string& script, const std::string& package_dir,
                              const std::vector<std::string>& files) {
  std::string cmd = "node " + ShellQuote(script) + " --package " + ShellQuote(package_dir);
  for (const std::string& f : files) {
    cmd.push_back(' ');
    cmd.append(ShellQuote(f));
  }
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return Status::Internal("cannot start node (popen failed)");
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int rc = ::pclose(pipe);
  if (rc == -1) return Status::Internal("waiting for node failed");
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 127)
    return Status::NotFound(fmt::format("node is not on PATH: {}", kSetupHint));
  if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0)
    return Status::NotFound(fmt::format(
        "the reference encoder (node {}) failed with status {}; its message is above ({})", script,
        WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, kSetupHint));
  return out;
}

Status ParseOutput(const std::string& out, size_t expected, std::vector<std::vector<int>>* ids) {
  size_t pos = 0;
  while (pos < out.size()) {
    size_t nl = out.find('\n', pos);
    if (nl == std::string::npos) nl = out.size();
    nlohmann::json line = nlohmann::json::parse(out.begin() + long(pos), out.begin() + long(nl),
                                                nullptr, /*allow_exceptions=*/false);
    if (!line.is_array())
      return Status::Internal(
          fmt::format("reference output line {} is not a JSON array", ids->size() + 1));
    std::vector<int> v;
    v.reserve(line.size());
    for (const auto& x : line) v.push_back(x.is_number_integer() ? x.get<int>() : -1);
    ids->push_back(std::move(v));
    pos = nl + 1;
  }
  if (ids->size() != expected)
    return Status::Internal(
        fmt::format("reference encoder printed {} lines for {} files", ids->size(), expected));
  return Status::Ok();
}

}  // namespace

StatusOr<std::string> FindReferenceScript() {
  std::vector<std::string> roots;
  if (const char* env = std::getenv("ATOLL_SOURCE_DIR"); env != nullptr && env[0] != '\0')
    roots.push_back(env);
  roots.push_back(".");
  if (ATOLL_BUILD_SOURCE_DIR[0] != '\0') roots.push_back(ATOLL_BUILD_SOURCE_DIR);
  for (const std::string& root : roots) {
    const std::string path = root + "/scripts/bpe_reference.js";
    if (FileExists(path)) return path;
  }
  return Status::NotFound(
      "scripts/bpe_reference.js not found (run from the repository root or set ATOLL_SOURCE_DIR)");
}

StatusOr<std::vector<std::vector<int>>> RunReferenceEncoder(const std::vector<std::string>& files,
                                                            const std::string& package_dir,
                                                            int processes) {
  ATOLL_ASSIGN_OR_RETURN(std::string script, FindReferenceScript());
  if (!FileExists(package_dir + "/Encoder.js"))
    return Status::NotFound(fmt::format("{}/Encoder.js not found: {}", package_dir, kSetupHint));
  processes = std::max(1, std::min<int>(processes, int(files.size())));
  // Contiguous shares of the file list, one per process, balanced by bytes: the reference's cost
  // grows faster than linearly with a file's size.
  std::vector<uint64_t> sizes(files.size());
  uint64_t total = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    std::error_code ec;
    sizes[i] = std::filesystem::file_size(files[i], ec);
    if (ec) sizes[i] = 0;
    total += sizes[i];
  }
  std::vector<std::vector<std::string>> shares(static_cast<size_t>(processes));
  uint64_t acc = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    size_t p = total == 0 ? i * size_t(processes) / files.size()
                          : size_t(acc * uint64_t(processes) / (total + 1));
    shares[std::min(p, size_t(processes) - 1)].push_back(files[i]);
    acc += sizes[i];
  }
  std::vector<StatusOr<std::string>> outputs(shares.size(), Status::Internal("not run"));
  std::vector<std::thread> threads;
  for (size_t p = 0; p < shares.size(); ++p) {
    if (shares[p].empty()) {
      outputs[p] = std::string();
      continue;
    }
    threads.emplace_back([&, p] { outputs[p] = RunNode(script, package_dir, shares[p]); });
  }
  for (auto& t : threads) t.join();
  std::vector<std::vector<int>> ids;
  ids.reserve(files.size());
  for (size_t p = 0; p < shares.size(); ++p) {
    if (!outputs[p].ok()) return outputs[p].status();
    ATOLL_RETURN_IF_ERROR(ParseOutput(*outputs[p], ids.size() + shares[p].size(), &ids));
  }
  return ids;
}

bool FirstMismatch(const std::vector<int>& ours, const std::vector<int>& reference,
                   TokenMismatch* m) {
  const size_t n = std::min(ours.size(), reference.size());
  size_t i = 0;
  while (i < n && ours[i] == reference[i]) ++i;
  if (i == n && ours.size() == reference.size()) return false;
  m->index = i;
  m->ours = i < ours.size() ? ours[i] : -1;
  m->reference = i < reference.size() ? reference[i] : -1;
  return true;
}

}  // namespace atl
